"""How serving speed depends on the packs a call: ``python tests/serving_calls.py MODEL_DIR [--input FILE]
[--packs 2,4,8,16,32] [--rows 8,16,32]``.

One torch thread, calls back to back (no other contender between them), medians of 5: the bare forward of the
predictor's packs of the inputs (the demo texts, or FILE's texts or pairs) in calls of each ``--packs`` size, and
transformers' BertForSequenceClassification on the same inputs sorted by length in batches of each ``--rows``
size, each padded to its longest. predict.packs_per_call's default is printed beside them. docs/results.md quotes
it (the peer table, Serving).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    sys.path[:0] = [REPO]
    import numpy as np
    import torch
    import transformers

    from ipu_packing.bench import classify_peers as cp
    from ipu_packing.predict import Predictor, read_inputs

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--input", default=None)
    p.add_argument("--inputs", type=int, default=1024)
    p.add_argument("--packs", default="2,4,8,16,32")
    p.add_argument("--rows", default="8,16,32")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    texts = (read_inputs(args.input, None, None) if args.input else cp.demo_texts()[0])[:args.inputs]
    predictor = Predictor.from_pretrained(args.model)
    packs = predictor.packs(texts)
    names = [n for n in ("input_ids", "token_type_ids", "position_ids", "sequence_ids", "cls_positions")
             if n in packs.arrays]
    contenders = {}
    for size in [int(x) for x in args.packs.split(",")]:
        calls = [{n: torch.from_numpy(np.ascontiguousarray(c.arrays[n])).long() for n in names}
                 for c in cp.pack_batches(packs, size)[0]]
        contenders["ours, %d packs a call" % size] = (predictor.model, calls)
    hf = transformers.BertForSequenceClassification.from_pretrained(args.model, attn_implementation="sdpa").eval()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(args.model)
    pairs = isinstance(texts[0], tuple)
    encoded = (tokenizer([a for a, _ in texts], [b for _, b in texts], truncation=True, max_length=128) if pairs
               else tokenizer(list(texts), truncation=True, max_length=128))
    ids = [list(e) for e in encoded["input_ids"]]
    types = [list(t) for t in encoded["token_type_ids"]] if pairs else None
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    for size in [int(x) for x in args.rows.split(",")]:
        contenders["transformers grouped, %d rows a call" % size] = (hf, cp.hf_batches(ids, order, size, None, None,
                                                                                       types)[0])

    def run(model, calls):
        with torch.inference_mode():
            for call in calls:
                model(**call)

    for model, calls in contenders.values():
        run(model, calls)
    seconds = {name: [] for name in contenders}
    for _ in range(5):
        for name, (model, calls) in contenders.items():
            start = time.perf_counter()
            run(model, calls)
            seconds[name].append(time.perf_counter() - start)
    print("%d inputs, %d packs; predict.packs_per_call: %d; load average %s"
          % (len(texts), len(packs), predictor.batch_packs, " ".join("%.2f" % x for x in os.getloadavg())))
    for name in contenders:
        print("  %-36s %9.1f sequences/s" % (name, len(texts) / float(np.median(seconds[name]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
