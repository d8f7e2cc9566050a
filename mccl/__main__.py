"""``python -m mccl <command>``: ``doctor`` (capabilities + local self-test)."""

from __future__ import annotations

import sys

COMMANDS = {"doctor": "capabilities of this machine and a local end-to-end self-test"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = "\n".join(f"  {k:<8} {v}" for k, v in COMMANDS.items())
        asked_help = bool(argv) and argv[0] in ("-h", "--help")
        unknown = f"error: unknown command {argv[0]!r}\n" if argv and not asked_help else ""
        print(f"{unknown}usage: python -m mccl <command> [options]\n\ncommands:\n{lines}",
              file=sys.stdout if asked_help else sys.stderr)
        return 0 if asked_help else 2
    from .doctor import main as doctor_main

    return doctor_main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
