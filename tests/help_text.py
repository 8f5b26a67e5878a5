"""Reading a command's ``--help`` output in tests."""


def help_entries(text: str) -> dict[str, str]:
    """``--help`` output -> each option's entry (its lines joined), by its first option string."""
    entries: dict[str, str] = {}
    name = ""
    for line in text.splitlines():
        if line.startswith("  -"):
            name = line.split()[0].rstrip(",")
            entries[name] = line.strip()
        elif line.startswith("    ") and name:
            entries[name] += " " + line.strip()
    return entries
