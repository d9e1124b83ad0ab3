"""Hash what CPU training and decoding compute for every registry case, to compare two commits bit for bit.

For each case of ``tests/registry_cases.py`` (and the route variants of ``tests/test_fused_structure.py``),
in fp32 and under bf16 autocast, on one CPU thread: three Adam updates of a tiny model on the synthetic
task (dropout on), then beam 3 on a test batch. One line per case and precision: a hash of the losses,
the final weights and the hypotheses. Run it in two checkouts and diff the outputs::

    python benchmarks/numerics_hash.py /tmp/numerics > new.txt
    (cd ../other-checkout && python /path/to/benchmarks/numerics_hash.py /tmp/numerics) > old.txt
    diff old.txt new.txt
    python benchmarks/numerics_hash.py --compare new.txt old.txt   # per precision, over the cases both have

The script imports ``structnmt`` and ``tests`` from the current directory, so the same file serves
both checkouts; the work directory (the prepared synthetic dataset) is shared between them.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, ".")  # the checkout run from, not the installed one

import torch  # noqa: E402

import tests.registry_cases as registry  # noqa: E402
from structnmt.data.batch import PAD_ID  # noqa: E402
from structnmt.model.losses import label_smoothed_nll  # noqa: E402

try:
    from structnmt.model.search import beam_search  # noqa: E402
except ImportError:  # checkouts before beam search moved into the model package (e.g. b1afacd)
    from structnmt.decoding.search import beam_search  # noqa: E402
try:
    from tests.test_fused_structure import EXTRA  # noqa: E402
except ImportError:  # checkouts before the route variants: the registry's cases alone
    EXTRA = {}


def case_hash(case: str, precision: str, dataset: Path, vocab: int) -> str:
    torch.manual_seed(0)
    model = registry.make_model(case, vocab)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    digest = hashlib.sha256()
    bf16 = precision == "bf16"
    model.train()
    for batch in registry.batches(dataset, "train", model, max_tokens=400)[:3]:
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(batch)
        loss, _ = label_smoothed_nll(out.logits.float(), batch.tgt_out, 0.1, ignore_index=PAD_ID)
        total = loss + sum((v.float() for v in out.losses.values()), torch.zeros(()))
        total.backward()
        optimizer.step()
        digest.update(repr(total.item()).encode())
    for p in model.parameters():
        digest.update(p.detach().float().numpy().tobytes())
    test = registry.batches(dataset, "test", model, max_tokens=300, inference=True)[0]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        hyps = beam_search(model, test, beam=3, max_len_b=10)
    digest.update(repr([[(h.tokens, float(h.score)) for h in beams] for beams in hyps]).encode())
    return digest.hexdigest()[:16]


def compare(files: list[Path]) -> None:
    """Each file's hashes against the first's, per precision, over the cases both have."""
    def load(file: Path) -> dict[tuple[str, str], str]:
        rows = (line.split() for line in file.read_text().splitlines() if line.strip())
        return {(case, precision): value for case, precision, value in rows}

    first = load(files[0])
    for file in files[1:]:
        other = load(file)
        for precision in ("bf16", "fp32"):
            keys = sorted(k for k in set(first) & set(other) if k[1] == precision)
            differ = [case for case, _ in keys if first[(case, precision)] != other[(case, precision)]]
            print(f"{file.name} {precision}: {len(keys) - len(differ)} of {len(keys)} cases the same as "
                  f"{files[0].name}" + (f"; differ: {', '.join(differ)}" if differ else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("work", type=Path, nargs="?",
                        help="work directory for the synthetic dataset (shared by both runs)")
    parser.add_argument("cases", nargs="*", help="cases to run (default: all)")
    parser.add_argument("--compare", nargs="+", type=Path, metavar="FILE",
                        help="compare saved outputs (each against the first) instead of hashing")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare)
        return
    if args.work is None:
        parser.error("the work directory is required (or --compare FILE ...)")
    torch.set_num_threads(1)
    registry.CASES.update(EXTRA)
    ready = args.work / "dataset.txt"
    if not ready.exists():
        ready.parent.mkdir(parents=True, exist_ok=True)
        ready.write_text(str(registry.prepare_synthetic(args.work)))
    dataset = Path(ready.read_text())
    vocab = registry.vocab_size(dataset)
    for case in args.cases or sorted(registry.all_cases()):
        for precision in ("fp32", "bf16"):
            print(case, precision, case_hash(case, precision, dataset, vocab), flush=True)


if __name__ == "__main__":
    main()
