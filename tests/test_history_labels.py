"""History lives in commit messages, never in names: what the project ships and teaches
says what a thing holds, not when or in which round it was made.

This test fails when one of these carries a history label:

* the text of README.md, docs/**, steps/lessons/*.md, every tracked file under tirx_gemm/
  (code, comments, docstrings and strings alike) and steps/**/*.py;
* the test names: the file names under tests/ and their test functions and classes;
* the path of any tracked file (git ls-files), outside results/ and a study's records/ and
  logs/ folders under lab/ (a record names the run it came from).

A history label is (case-insensitive):

* an issue, stop or session number: "issue 32", "issue #32", "Issue 12:", "stop 52",
  "session 3", "stop 51/52/53"; the plural counts before a list ("issues 17 and 18",
  "stops 51-53"), not as a verb ("the warpgroup issues 8 wgmmas");
* a run label as this repository wrote them: "call 2" / "call2" (the calls of a GPU
  session), "fresh51", and the suite-run labels s9-s19, s50-s59 and h7-h19 ("the s13
  bundles", "run h12", "_h12i.jsonl"); these numbers are the runs the lab made, so a
  variable such as s0 or s1 (a slab, a split) is not one;
* a commit hash in prose: a word of 7-40 hex digits holding a digit and a letter a-f,
  written as a word of its own ("against 76def98", "(commit 2f95121)", "git_sha^=91c28c0f")
  and not a number or a constant: not after "0x" or "#", not inside a longer run of letters,
  digits, "-" or "_" (a UUID's or a 64-digit sha256 digest's parts, an identifier), and not
  all digits or all letters.

test_matcher_catches_planted_labels shows the matcher can fail, and what it leaves alone.
"""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_LIST = r"(?:\s*(?:,|and|or|/|-|–)\s*#?\d+)"  # "17 and 18", "51-53", "51/52"
_START = r"(?<![A-Za-z])"  # a label may follow "_" or a digit (file names: h200_issue32_s12)
LABEL = re.compile(
    _START + r"(?:issue|stop|session)\s?#?\d+"                   # issue 32, stop 52, issue #7
    + r"|" + _START + r"(?:issue|stop|session)s\s?#?\d+" + _LIST + r"+"  # issues 17 and 18
    + r"|" + _START + r"call\s?\d+(?![0-9])"                     # call 2, call2
    + r"|" + _START + r"fresh\d+"                                  # fresh51
    + r"|(?<![A-Za-z0-9])[sh](?:9|1\d|5\d)i?(?![A-Za-z0-9])"     # s13, h12i, s52 (runs)
    + r"|(?<![A-Za-z0-9])h[78]i?(?![A-Za-z0-9])",                 # h7
    re.IGNORECASE)
HASH = re.compile(r"(?<![0-9A-Za-z_\-#/.])(?<!0x)(?<!0X)([0-9a-fA-F]{7,40})(?![0-9A-Za-z_\-])")

# a word of this shape that is no hash (a hex-looking English word would need a digit)
TEXT_SUFFIXES = {".py", ".md", ".json", ".yml", ".yaml", ".txt", ".toml", ".cfg", ".ini",
                 ".sh", ".html", ".css", ".js", ".cu", ".h"}


def labels_in(text: str) -> list[str]:
    """Every history label and commit hash in ``text`` (see the module's docstring)."""
    found = [m.group(0) for m in LABEL.finditer(text)]
    for m in HASH.finditer(text):
        word = m.group(1)
        if re.search(r"\d", word) and re.search(r"[a-fA-F]", word) \
                and not re.search(r"0123|abcd", word, re.IGNORECASE):  # a hex alphabet
            found.append(word)
    return found


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True, timeout=60).stdout
        return [p for p in out.splitlines() if (ROOT / p).exists()]
    except (OSError, subprocess.SubprocessError):  # not a git checkout: the tree itself
        skip = {".git", "build", ".venv", "vendor", "node_modules", "__pycache__"}
        return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


def _texts() -> list[str]:
    """The files whose text is checked."""
    out = []
    for p in _tracked():
        path = Path(p)
        if path.suffix not in TEXT_SUFFIXES and p != "README.md":
            continue
        if (p == "README.md" or p.startswith("docs/")
                or (p.startswith("steps/lessons/") and path.suffix == ".md")
                or p.startswith("tirx_gemm/")
                or (p.startswith("steps/") and path.suffix == ".py")):
            out.append(p)
    return sorted(out)


def _report(hits: dict) -> str:
    lines = [f"{where}: {', '.join(sorted(set(found)))}" for where, found in sorted(hits.items())]
    return (f"{len(hits)} places carry history labels (history belongs in commit messages; "
            "name things by what they hold):\n" + "\n".join(lines))


def test_matcher_catches_planted_labels():
    planted = ["fixed in issue 32", "Issue 12: the pool", "issue #7", "(stop 52)",
               "stop 51/52/53", "issues 17 and 18", "stops 51-53", "session 3's run",
               "H200 call 2, bf16", "epilogue_h200_call2.jsonl", "results/logs/fresh51_after/",
               "the s13 bundles", "run h12", "heldout_h12i.jsonl", "in s9 and", "the s52 run",
               "against 76def98", "(commit 2f95121)", "git_sha^=91c28c0f", "b3e7c55,"]
    for text in planted:
        assert labels_in(text), f"missed a label in {text!r}"
    clean = ["the warpgroup issues 8 wgmma", "then issues 4 block-scaled MMAs",
             "slab s0 and s1", "hgemm_v12", "H200 and H100", "sm_100a, e4m3, bf16",
             "0x1f2e3d4c5b", "#1f77b4", "a UUID 550e8400-e29b-41d4-a716-446655440000",
             "sha256 " + "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
             "deadbeef", "12345678", "the call site", "a stop at the end", "s2 = 3",
             "abc_1234567d", "cafe123-suffix", '"0123456789abcdef"']
    for text in clean:
        assert not labels_in(text), f"{text!r} is no history label: {labels_in(text)}"


def test_docs_code_and_lessons_carry_no_history_labels():
    hits = {}
    for p in _texts():
        try:
            text = (ROOT / p).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            found = labels_in(line)
            if found:
                hits[f"{p}:{n}"] = found
    assert not hits, _report(hits)


def test_test_names_carry_no_history_labels():
    hits = {}
    for path in sorted((ROOT / "tests").glob("*.py")):
        if labels_in(path.stem.replace("_", " ")) or labels_in(path.stem):
            hits[f"tests/{path.name}"] = labels_in(path.stem.replace("_", " "))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                    and node.name.lower().startswith("test"):
                found = labels_in(node.name.replace("_", " "))
                if found:
                    hits[f"tests/{path.name}::{node.name}"] = found
    assert not hits, _report(hits)


def _records_or_logs(p: str) -> bool:
    parts = Path(p).parts
    return parts[0] == "results" or (parts[0] == "lab" and ("records" in parts
                                                             or "logs" in parts))


def test_file_names_carry_no_history_labels():
    hits = {}
    for p in _tracked():
        if _records_or_logs(p):
            continue
        for part in Path(p).parts:
            found = labels_in(re.sub(r"[_.]", " ", part))
            if found:
                hits[p] = found
    assert not hits, _report(hits)
