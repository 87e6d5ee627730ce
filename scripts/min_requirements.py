"""Pin every declared dependency to its floor, for `make test-min`.

The floors are declared once, as the ``>=`` bounds in pyproject.toml; this script turns them into ``==`` pins
(a requirements file for pip) so that the suite can run against exactly the oldest versions the package
claims to support. A requirement without a ``>=`` bound (a weights package) is written unpinned.

torch is left out: `make test-min` installs the CPU wheel from local disk first (an unpinned or old torch from
PyPI is a multi-GB CUDA build), so its floor is the one requirement this target does not check.

Usage: python scripts/min_requirements.py [--extras real,embed,dev] [--out FILE]
       python scripts/min_requirements.py --check   # the installed versions against the pins; exit 1 if one differs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        raise SystemExit("scripts/min_requirements.py reads pyproject.toml with tomllib (Python >= 3.11); "
                         "on Python 3.10: pip install tomli") from None

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EXTRAS = ("real", "embed", "dev")
# Installed outside these pins (see the module docstring).
SKIP = {"torch"}
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*(;.*)?$")


def pin(requirement: str) -> str | None:
    """``name>=X[,...]`` -> ``name==X``; a requirement without a floor stays as it is; a skipped name -> None."""
    m = _REQ.match(requirement)
    if m is None:
        raise ValueError(f"pyproject.toml: cannot parse the requirement {requirement!r}")
    name, extras, spec, marker = m.group(1), m.group(2) or "", m.group(3), m.group(4) or ""
    if name.lower() in SKIP:
        return None
    floors = re.findall(r">=\s*([^,\s]+)", spec)
    if len(floors) > 1:
        raise ValueError(f"pyproject.toml: {requirement!r} has more than one floor")
    if not floors:
        if spec:
            raise ValueError(f"pyproject.toml: {requirement!r} has a bound but no `>=` floor to pin")
        return requirement.strip()
    return f"{name}{extras}=={floors[0]}{marker}"


def min_requirements(pyproject: Path = ROOT / "pyproject.toml", extras: tuple[str, ...] = DEFAULT_EXTRAS) -> list[str]:
    """The pinned requirement lines for the dependencies and the given extras, deduplicated, in order."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise ValueError(f"{pyproject}: no optional-dependencies group {unknown}; have {sorted(optional)}")
    reqs = list(project["dependencies"]) + [r for e in extras for r in optional[e]]
    out: list[str] = []
    seen: dict[str, str] = {}
    for r in reqs:
        line = pin(r)
        if line is None:
            continue
        key = re.split(r"[<>=!~\[ ;]", line, maxsplit=1)[0].lower()
        if key in seen:
            if seen[key] != line:
                raise ValueError(f"{pyproject}: {key} is declared twice with different floors: {seen[key]!r}, {line!r}")
            continue
        seen[key] = line
        out.append(line)
    return out


def check(lines: list[str]) -> list[str]:
    """One line per pinned package (installed version, and "!= floor" where it differs), plus the packages
    that matter but are not pinned here; raise SystemExit(1) after printing if a pin is not what is installed."""
    from importlib.metadata import PackageNotFoundError, version

    report, bad = [], []
    for line in lines:
        name, _, want = line.partition("==")
        name = re.split(r"[\[; ]", name, maxsplit=1)[0]
        try:
            have = version(name)
        except PackageNotFoundError:
            have = "not installed"
        ok = not want or _same(have, want.split(";")[0])
        report.append(f"{name}=={have}" + ("" if ok else f"   (floor {want})"))
        if not ok:
            bad.append(name)
    for name in ("torch", "huggingface-hub", "tokenizers", "safetensors", "pyarrow", "pandas"):
        try:
            report.append(f"{name}=={version(name)}   (not pinned: a dependency's dependency or installed first)")
        except PackageNotFoundError:
            pass
    print("\n".join(report))
    if bad:
        print(f"installed versions differ from the floors: {', '.join(bad)}", file=sys.stderr)
        raise SystemExit(1)
    return report


def _same(have: str, want: str) -> bool:
    """``2.0`` pins ``2.0.0``: compare release numbers padded with zeros."""
    def parts(v: str) -> list[str]:
        return v.split("+")[0].split(".")

    a, b = parts(have), parts(want)
    n = max(len(a), len(b))
    return a + ["0"] * (n - len(a)) == b + ["0"] * (n - len(b))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extras", default=",".join(DEFAULT_EXTRAS), help="comma-separated extras to include")
    ap.add_argument("--out", help="write here instead of stdout")
    ap.add_argument("--check", action="store_true", help="print the installed version of each pinned package; "
                    "exit 1 if one is not its floor")
    args = ap.parse_args(argv)
    extras = tuple(e for e in args.extras.split(",") if e)
    if args.check:
        check(min_requirements(extras=extras))
        return 0
    text = "# Generated by scripts/min_requirements.py from pyproject.toml; do not edit.\n"
    text += "\n".join(min_requirements(extras=extras)) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
