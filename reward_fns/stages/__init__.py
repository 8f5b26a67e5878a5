"""The speech reward's stages (`reward_fns.pipeline.SpeechReward` runs them in this order):

    admit (`admit.Admission`)                 request checked, response parsed and gated, a model for its language
    decode (`decode.decode_responses`)        codes -> 16 kHz waveform
    recognise (`recognise`)                   waveform check, transcript (+ word times), empty-transcript check
    measure (`measure`, when configured)      reference likelihood, DNSMOS quality, prompt decode + speaker similarity
    score (`score.score`)                     error rate and the composed score (`reward_fns.reward.compose`)
    extras                                    per-frame signals (`score.add_frame_signals`), the second ear
                                              (`second_ear.hear_again`)

Each stage maps a batch's `sample.Sample` records to the same records, in order, with what it learnt; a sample it
fails on alone carries a `sample.Failure` and is skipped by the later stages (`sample.through`). The code ear's
scoring (`reward_fns.ear_scoring`) replaces decode, recognise and score for a reward heard by the ear; the rows
that ask to be evaluated are still decoded and heard, never scored by what the audio ears hear.
"""
