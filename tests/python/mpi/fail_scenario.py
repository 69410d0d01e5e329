"""fail_scenario.py MODE [SPEC [STRATEGY]] - a dead or stalled peer under DistributedOptimizer.

    exit   rank 1 leaves (os._exit) just before the third step's backward;
    stall  rank 1 sleeps through the third step (3 timeouts), then leaves.
Every survivor's step() must raise CollectiveTimeout or MPIError within the timeout (plus
slack), the optimizer's state_dict() must still be savable (the residuals of a failed
bucket are what a restart needs), and then the survivor prints "SURVIVOR-OK rank R: ..."
and leaves with os._exit(0) - after a peer died, MPI_Finalize may itself wait for it.
Anything else prints "FAIL rank R: ...".  ctest runs it through tests/mpi/run_fail.sh,
which passes only when every survivor reported within a hard time limit (so a hang fails).
"""

import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), "python"))

from mpi4py import MPI  # noqa: E402

import torch  # noqa: E402

import gradcomp  # noqa: E402
import gradcomp.torch as gt  # noqa: E402

TIMEOUT = 2.0
RANK = MPI.COMM_WORLD.rank


def say(tag, msg):
    # One write(2) of one line (< PIPE_BUF): lines of ranks that leave at once never mix.
    os.write(1, f"{tag} rank {RANK}: {msg[:2000]}\n".encode())


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "exit"
    spec = sys.argv[2] if len(sys.argv) > 2 else "topk:density=0.05,feedback=ef"
    strategy = sys.argv[3] if len(sys.argv) > 3 else "auto"
    if MPI.COMM_WORLD.size < 2:
        say("FAIL", "needs 2 ranks or more")
        return
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    opt = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                  compression=f"spec={spec};min_elements=64", strategy=strategy, timeout=TIMEOUT)
    gen = torch.Generator().manual_seed(RANK)
    for step in range(3):
        x, y = torch.randn(16, 32, generator=gen), torch.randint(0, 4, (16,), generator=gen)
        if step == 2 and RANK == 1:
            if mode == "exit":
                os._exit(0)
            time.sleep(3 * TIMEOUT + 2)
            os._exit(0)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        t0 = time.monotonic()
        try:
            opt.step()
        except (gradcomp.CollectiveTimeout, gradcomp.MPIError) as e:
            took = time.monotonic() - t0
            if step != 2:
                say("FAIL", f"step {step} failed before any peer did: {e}")
            elif took > TIMEOUT + 5:
                say("FAIL", f"the error came after {took:.1f} s")
            elif opt.communicator.status() is None:
                say("FAIL", "the communicator does not say it failed")
            else:
                sd = opt.state_dict()
                nbytes = sum(len(b) for b in sd["gradcomp"]["buckets"])
                say("SURVIVOR-OK", f"{type(e).__name__} after {took:.2f} s ({e}); saved {nbytes} bytes of state")
            return
        if step == 2:
            say("FAIL", "step 2 succeeded without its peer")
            return


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        say("FAIL", traceback.format_exc().replace("\n", " | "))
    sys.stdout.flush()
    os._exit(0)
