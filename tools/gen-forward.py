#!/usr/bin/env python3
"""Lists every method of Burn's backend op traits as `fn name(args) -> ret;` lines.

Used to write the forwarding lists of `afterburner_precision::Autocast` (crates/precision/src/
backend/forward/*.rs) when the pinned Burn version changes:

    python3 tools/gen-forward.py ~/.cargo/registry/src/*/burn-backend-0.21.0

prints, per trait, the signatures with the trait's `B` replaced by `Self`, `mut` argument
bindings dropped and leading underscores kept out of argument names. Generic methods are listed
under "write by hand".
"""
import re
import sys
from pathlib import Path

TRAITS = {
    "FloatTensorOps": "backend/ops/tensor.rs",
    "IntTensorOps": "backend/ops/int_tensor.rs",
    "BoolTensorOps": "backend/ops/bool_tensor.rs",
    "ModuleOps": "backend/ops/modules/base.rs",
    "ActivationOps": "backend/ops/activation.rs",
    "QTensorOps": "backend/ops/qtensor.rs",
    "TransactionOps": "backend/ops/transaction.rs",
}


def strip_comments(text):
    return "\n".join(re.sub(r"//.*$", "", line) for line in text.splitlines())


def trait_body(text, name):
    start = re.search(r"pub trait " + name + r"\b[^{]*\{", text)
    depth, i = 1, start.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[start.end() : i - 1]


def signatures(body):
    """Each method's signature, up to its body or `;`, at brace depth 0 of the trait body."""
    out, depth, i = [], 0, 0
    while i < len(body):
        c = body[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif depth == 0 and body.startswith("fn ", i) and (i == 0 or not body[i - 1].isalnum()):
            j, paren = i, 0
            while True:
                ch = body[j]
                if ch in "(<[":
                    paren += 1
                elif ch in ")]":
                    paren -= 1
                elif ch == ">" and body[j - 1] != "-":
                    paren -= 1
                elif paren == 0 and ch in "{;":
                    break
                j += 1
            out.append(" ".join(body[i:j].split()))
            i = j
            continue
        i += 1
    return out


def normalise(sig):
    sig = re.sub(r"\bB\b", "Self", sig)
    sig = re.sub(r"\bmut (\w+):", r"\1:", sig)
    sig = re.sub(r"([(,] ?)_(\w+):", r"\1\2:", sig)
    return sig.replace("( ", "(").replace(", )", ")").replace(",)", ")")


def main(root):
    for trait, rel in TRAITS.items():
        text = strip_comments((Path(root) / "src" / rel).read_text())
        sigs = [normalise(s) for s in signatures(trait_body(text, trait))]
        manual = [s for s in sigs if re.match(r"fn \w+<", s) or " where " in s]
        print(f"// {trait}: {len(sigs)} methods")
        for s in sigs:
            if s not in manual:
                print(s + ";")
        for s in manual:
            print("// write by hand: " + s)


if __name__ == "__main__":
    main(sys.argv[1])
