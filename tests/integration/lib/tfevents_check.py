"""Checks a save_folder's TensorBoard event files against its metrics.jsonl, with the
`tensorboard` package's own readers (test virtualenv):

1. every events.out.tfevents.* file is read record by record with TensorBoard's TFRecord
   reader (tensorboard.compat.tensorflow_stub PyRecordReader_New): a torn (truncated) record or
   a checksum mismatch anywhere is an error naming the file;
2. TensorBoard's EventAccumulator loads the directory as `tensorboard --logdir` would, and
   every scalar of every metrics.jsonl line must be there at its step, equal to the JSON value
   rounded to float32 (null <-> NaN/inf), under "train/<key>", "perf/<key>" or
   "eval/<label>/<key>" (the perf/ numbers, printed with fewer digits, to 1 float32 ulp and
   step_s to its 4 decimals); and nothing else may be there (no step logged twice, e.g. after a resume).

usage: tfevents_check.py SAVE_FOLDER [--allow-missing-last]
  --allow-missing-last: the newest metrics line may lack its event (a process killed between
  the two writes).
exit 0: match; 1: mismatch or damaged file (the reason on stderr).
"""
import glob
import json
import math
import os
import sys

import numpy as np
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow


def fail(msg):
    print("tfevents_check: " + msg, file=sys.stderr)
    sys.exit(1)


def read_strict(path):
    """Every Event of one file; any damage is fatal."""
    reader = pywrap_tensorflow.PyRecordReader_New(path, 0, None, None)
    events = []
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return events
        except errors.DataLossError as e:
            fail(f"{path}: damaged after {len(events)} records: {e.message}")
        ev = event_pb2.Event()
        ev.ParseFromString(reader.record())
        events.append(ev)


def expected_scalars(jsonl):
    """{(tag, step): value} from metrics.jsonl, and the step of the last line."""
    want, last = {}, None
    for line in open(jsonl):
        row = json.loads(line)
        step = row.pop("step")
        last = step
        if "eval" in row:
            prefix = "eval/%s/" % row.pop("eval")
        else:
            prefix = "train/"
            row.pop("expert_tokens", None)
        perf = row.pop("perf", {})
        for key, v in list(row.items()) + [("\0" + k, v) for k, v in perf.items()]:
            tag = ("perf/" + key[1:]) if key.startswith("\0") else prefix + key
            want[(tag, step)] = v
    return want, last


def main():
    folder = sys.argv[1]
    allow_missing_last = "--allow-missing-last" in sys.argv[2:]
    files = sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*")))
    if not files:
        fail(f"no event files in {folder}")
    for path in files:
        events = read_strict(path)
        if not events or events[0].file_version != "brain.Event:2":
            fail(f"{path}: does not start with the file_version record")
    want, last = expected_scalars(os.path.join(folder, "metrics.jsonl"))

    acc = event_accumulator.EventAccumulator(folder, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    got = {}
    for tag in acc.Tags()["scalars"]:
        for s in acc.Scalars(tag):
            if (tag, s.step) in got:
                fail(f"{tag} at step {s.step} is in the event files twice")
            got[(tag, s.step)] = s.value
    missing = sorted(k for k in want if k not in got)
    if allow_missing_last:
        missing = [k for k in missing if k[1] != last]
    if missing:
        fail(f"{len(missing)} scalars of metrics.jsonl are not in the event files, e.g. {missing[:3]}")
    extra = sorted(k for k in got if k not in want)
    if extra:
        fail(f"{len(extra)} scalars in the event files are not in metrics.jsonl, e.g. {extra[:3]}")
    for key, v in want.items():
        if key not in got:
            continue
        g = got[key]
        if v is None:
            ok = not math.isfinite(g)
        elif key[0] == "perf/step_s":   # metrics.jsonl prints it with 4 decimals ("%.4f")
            ok = abs(float(v) - g) <= 0.5e-4 * (1 + 1e-6)
        elif key[0].startswith("perf/"):   # printed "%.9g": its float32 may be one ulp off the value's
            ok = abs(np.float32(float(v)) - np.float32(g)) <= np.spacing(np.float32(g))
        else:
            ok = np.float32(float(v)) == np.float32(g)
        if not ok:
            fail(f"{key[0]} at step {key[1]}: event file {g!r}, metrics.jsonl {v!r}")
    print(f"tfevents_check: {len(got)} scalars in {len(files)} file(s) match metrics.jsonl")


main()
