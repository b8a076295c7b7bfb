"""What the reference checks against `spes` share: a check that prints ok / FAIL and keeps the
failures, running a command, and the exit code with the count."""
import subprocess

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(cmd):
    """(exit code, stdout + stderr) of cmd."""
    res = subprocess.run(cmd, capture_output=True, text=True)
    return res.returncode, res.stdout + res.stderr


def must(cmd, what):
    """Runs cmd, checks that it exits 0 (its output's end in the message if not); its output."""
    code, log = run(cmd)
    check(code == 0, what + " exits 0" + ("" if code == 0 else ": " + log[-2000:]))
    return log


def summary():
    """Prints the failure count; the script's exit code."""
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


def stop_and_unused(free_run, vocab):
    """From a greedy run that did not stop: (t, x), t a token it first makes after its second
    step (an eos it would stop at there), x one it never makes (an eos it never reaches); None
    when the run has no such t or x."""
    k = next((i for i in range(2, len(free_run)) if free_run[i] not in free_run[:i]), None)
    unused = [i for i in range(vocab) if i not in free_run]
    return None if k is None or not unused else (free_run[k], unused[0])
