"""Process set-up shared by the CLI and every actor: quiet libraries, bounded threads."""

from __future__ import annotations

import logging
import os
import sys
import warnings


def quiet_libraries() -> None:
    """Silence progress bars and chatty warnings from transformers and friends (through
    their environment variables, which they read when imported: importing transformers here
    would cost seconds before a config or data error could be reported)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", message=".*generation flags are not valid.*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    if "transformers" in sys.modules:  # imported already: it has read the variables
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    # the openai client's HTTP layer logs every request at INFO: an openai_agent run's agents
    # make one per chat completion, thousands a step (httpx2 is what newer openai releases use)
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)


def limit_threads(num_cpus: float) -> int:
    """Use as many torch threads as CPUs this process was given (at least one)."""
    import torch

    threads = max(1, int(num_cpus))
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    return threads


def pick_device(num_gpus: float) -> str:
    """ "cuda" when this actor was given a GPU and one is visible, else "cpu"."""
    import torch

    return "cuda" if num_gpus > 0 and torch.cuda.is_available() else "cpu"


def resident_bytes() -> int | None:
    """This process's resident memory now (``/proc/self/statm``), or None where /proc does
    not tell (another OS)."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def memory_in_use(device: str) -> int | None:
    """Memory in use that a colocated hand-over moves: the used bytes of every GPU this
    process sees for a CUDA device (every process on them, as vLLM and the learners share
    them), this process's resident bytes on a CPU."""
    if device.startswith("cuda"):
        import torch

        used = 0
        for index in range(torch.cuda.device_count()):  # a TP engine's GPUs all count
            free, total = torch.cuda.mem_get_info(index)
            used += total - free
        return used
    return resident_bytes()


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the OS (glibc's ``malloc_trim``). Tensors below
    glibc's mmap threshold (which grows to 32 MiB as large blocks are freed) live on the heap,
    and freeing them only marks their pages reusable: the process would keep them resident.
    A no-op where the C library has no ``malloc_trim``."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:
        trim(0)


# Fault injection (tests, and the hunt for the learner aborts of docs/status.md): a learner
# rank whose environment has RLSYS_ABORT_AT=<phase>:<rank>:<n>:<marker file> aborts (SIGABRT,
# as glibc's heap checks do) on entering its n-th call of <phase> (train_step,
# save_checkpoint, save_hf, ...), once per marker file: it creates the file first, so the rank
# that replaces it carries on. ``placement.thread_env`` passes the variable on to every actor.
ABORT_ENV = "RLSYS_ABORT_AT"
_calls: dict[str, int] = {}


def abort_if_asked(phase: str, rank: int) -> None:
    """Abort this process here if ``RLSYS_ABORT_AT`` names this ``phase`` call of ``rank``
    and its marker file does not exist yet (see above)."""
    spec = os.environ.get(ABORT_ENV)
    if not spec:
        return
    want_phase, want_rank, nth, marker = spec.split(":", 3)
    if want_phase != phase or int(want_rank) != rank:
        return
    _calls[phase] = _calls.get(phase, 0) + 1
    if _calls[phase] != int(nth):
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:  # aborted once already: this is the replacement
        return
    os.abort()
