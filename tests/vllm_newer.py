"""The "newer vLLM" fixtures (tests/fixtures/vllm/newer/): engine lines, SpecDecoding lines and a /metrics page of a
vLLM newer than the collection's tables, made from the real captures by the edits listed in ``derivation.json`` there.

    python -m tests.vllm_newer          rewrite the files from the captures (after `make captures` re-recorded them)

The unit tests check that the committed files are what the derivation makes, so no edit goes unrecorded.
"""
import json
import os
import sys

from tests.paths import REPO

CAPTURES = os.path.join(REPO, "tests", "fixtures", "vllm")
NEWER = os.path.join(CAPTURES, "newer")


def derivation():
    with open(os.path.join(NEWER, "derivation.json"), encoding="utf-8") as handle:
        return json.load(handle)["files"]


def derive():
    """``{file name: text}``: every file of the folder as the derivation makes it from the captures."""
    out = {}
    for name, parts in derivation().items():
        lines = []
        for part in parts:
            with open(os.path.join(CAPTURES, part["capture"]), encoding="utf-8") as handle:
                source = handle.read().splitlines()
            if "find" in part:
                holding = [line for line in source if part["find"] in line]
                if len(holding) < part["nth"]:
                    raise ValueError("%s: %s has %d lines with %r, not %d" % (name, part["capture"], len(holding), part["find"], part["nth"]))
                taken = [holding[part["nth"] - 1]]
            else:
                taken = source
            text = "\n".join(taken)
            for old, new in part.get("replace", []):
                if old not in text:
                    raise ValueError("%s: %r is not in the line of %s taken" % (name, old, part["capture"]))
                text = text.replace(old, new)
            taken = text.split("\n")
            if "insert_after_last" in part:
                at = max(i for i, line in enumerate(taken) if line.startswith(part["insert_after_last"]))
                taken[at + 1:at + 1] = part["lines"]
            lines.extend(taken)
        out[name] = "\n".join(lines) + "\n"
    return out


def main():
    for name, text in derive().items():
        with open(os.path.join(NEWER, name), "w", encoding="utf-8") as handle:
            handle.write(text)
        sys.stdout.write("wrote %s\n" % os.path.join(NEWER, name))


if __name__ == "__main__":
    main()
