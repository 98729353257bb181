"""memwarden devices [PROFILE] [--json]"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "devices",
        help="list device profiles: memory, the share a model can use, bandwidth",
        description=(
            "List the built-in device profiles, smallest usable memory first, or show one profile in full "
            "(a built-in id or your own .toml file, which is validated)."
        ),
    )
    p.add_argument("profile", nargs="?", metavar="PROFILE", help="a built-in id or a .toml profile to show in full")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memwarden.models.devices import list_profiles, load_profile

    one = getattr(args, "profile", None)
    profiles = [load_profile(one)] if one else list_profiles()
    if args.json:
        from memwarden.commands._common import print_json

        print_json({"devices": [p.to_json() for p in profiles]})
        return 0

    from rich.console import Console

    from memwarden.report.devices import profile_details, profile_header, profiles_table

    console = Console()
    if one:
        console.print(profile_header(profiles[0]))
        console.print(profile_details(profiles[0]))
    else:
        console.print(profiles_table(profiles))
    return 0
