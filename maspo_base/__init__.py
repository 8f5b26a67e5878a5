"""The base the plugin and the reward share: speech-token layouts (`maspo_base.speech_tokens`), the codecs that turn
a response's codes into audio (`maspo_base.codecs`), the per-frame signals a reward reports and the plugin reads
(`maspo_base.frame_errors`, `maspo_base.frame_words`), typed settings and registries. It imports neither veRL nor
the other packages."""
