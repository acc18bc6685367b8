"""Refuse a pickle that names anything outside an allow-list, before anything unpickles it.

Some files of a checkpoint are pickles that torch reads with ``pickle.load`` (DCP's
``.metadata``), and unpickling calls whatever the file names: ``os.system`` is one opcode
away. A checkpoint is something people download and share, so rlsys reads the opcodes first
(``pickletools.genops``: parsing only, nothing is called) and refuses the file unless every
callable it names is on the allow-list of the file's kind.

A global is named by GLOBAL (``module name`` in its argument) or by STACK_GLOBAL, which takes
module and name from the stack: the scan accepts STACK_GLOBAL only when the two operations
before it (memo bookkeeping aside) push strings, directly or from the memo, so what it
resolves is exactly what the unpickler would import. Anything it cannot resolve is refused.
"""

from __future__ import annotations

import pickletools
import zipfile
from collections.abc import Iterable
from pathlib import Path

_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING"}
_STRING_OPS |= {"SHORT_BINSTRING", "BINSTRING"}
_GET_OPS = {"BINGET", "LONG_BINGET", "GET"}
_PUT_OPS = {"BINPUT", "LONG_BINPUT", "PUT"}

_DTYPES = [
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
]

# DCP's .metadata (torch.distributed.checkpoint): its dataclasses, torch sizes, dtypes and
# layouts, and the path it was saved to.
DCP_METADATA_GLOBALS = frozenset(
    {
        *(
            f"torch.distributed.checkpoint.metadata {name}"
            for name in (
                "Metadata",
                "TensorStorageMetadata",
                "BytesStorageMetadata",
                "ChunkStorageMetadata",
                "TensorProperties",
                "MetadataIndex",
                "StorageMeta",
                "_MEM_FORMAT_ENCODING",
            )
        ),
        "torch.distributed.checkpoint.filesystem _StorageInfo",
        "torch Size",
        "torch.serialization _get_layout",
        "collections OrderedDict",
        "pathlib PosixPath",
        "pathlib WindowsPath",
        "pathlib._local PosixPath",  # Python 3.13+
        "pathlib._local WindowsPath",
        *(f"torch {dtype}" for dtype in _DTYPES),
    }
)

_STORAGES = "Float Double Half BFloat16 Long Int Short Char Byte Bool ComplexFloat ComplexDouble"

# torch.save'd files (zip archives with a data.pkl): what tensors, sizes and dtypes need.
TORCH_GLOBALS = frozenset(
    {
        "collections OrderedDict",
        "torch Size",
        "torch Tensor",
        "torch._utils _rebuild_tensor_v2",
        "torch._utils _rebuild_parameter",
        "torch._tensor _rebuild_from_type_v2",
        "torch.nn.parameter Parameter",
        "torch.storage UntypedStorage",
        *(f"torch {kind}Storage" for kind in _STORAGES.split()),
        *(f"torch {dtype}" for dtype in _DTYPES),
    }
)
# DeepSpeed's ZeRO checkpoint files: torch's, plus the few DeepSpeed types they hold.
DEEPSPEED_GLOBALS = TORCH_GLOBALS | {
    "deepspeed.runtime.fp16.loss_scaler LossScaler",
    "deepspeed.runtime.fp16.loss_scaler DynamicLossScaler",
    "deepspeed.runtime.zero.config ZeroStageEnum",
    "deepspeed.utils.tensor_fragment fragment_address",
}


class UnsafePickleError(ValueError):
    """A pickle that names a callable outside its allow-list, or cannot be scanned."""


def globals_of(data: bytes) -> list[str]:
    """Every global (``"module name"``) the pickle ``data`` would import, in order; raises
    UnsafePickleError when one cannot be resolved without running the pickle."""
    found: list[str] = []
    memo: dict[int, str | None] = {}
    recent: list[str | None] = []  # what the latest operations pushed (None: not a string)
    try:
        for op, arg, _ in pickletools.genops(data):
            name = op.name
            if name in _STRING_OPS:
                recent.append(arg if isinstance(arg, str) else None)
            elif name in _GET_OPS:
                recent.append(memo.get(arg))
            elif name == "MEMOIZE":
                memo[len(memo)] = recent[-1] if recent else None
                continue  # memo bookkeeping leaves the stack as it is
            elif name in _PUT_OPS:
                memo[arg] = recent[-1] if recent else None
                continue
            elif name in ("FRAME", "PROTO"):
                continue  # framing: a frame may split a module string from its name
            elif name in ("EXT1", "EXT2", "EXT4"):
                raise UnsafePickleError(f"an {name} operation (a global from the copyreg registry)")
            elif name == "GLOBAL":
                found.append(str(arg))
                recent.append(None)
            elif name == "STACK_GLOBAL":
                if len(recent) < 2 or recent[-1] is None or recent[-2] is None:
                    raise UnsafePickleError("a STACK_GLOBAL whose module and name are not literal")
                found.append(f"{recent[-2]} {recent[-1]}")
                recent.append(None)
            elif name in ("INST", "OBJ"):
                raise UnsafePickleError(f"an {name} operation (protocol 0 class instantiation)")
            else:
                recent.append(None)
    except (ValueError, EOFError) as exc:
        if isinstance(exc, UnsafePickleError):
            raise
        raise UnsafePickleError(f"not a valid pickle: {exc}") from exc
    odd = [name for name in found if "\\" in name or name.count(" ") != 1]
    if odd:  # pickletools decodes escapes the unpickler does not: refuse what could differ
        raise UnsafePickleError(f"globals with unusual names {odd}")
    return found


def check_torch_file(path: Path, allowed: Iterable[str], what: str) -> None:
    """``check_pickle`` for a file ``torch.save`` wrote (a zip holding ``*/data.pkl``); the
    legacy format and anything else that is not such an archive is refused."""
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = {n: archive.read(n) for n in archive.namelist() if n.endswith(".pkl")}
    except (OSError, zipfile.BadZipFile) as exc:
        raise UnsafePickleError(f"{what} {path} is not a torch zip archive: {exc}") from exc
    if not pickles:
        raise UnsafePickleError(f"{what} {path} holds no data.pkl")
    for name, data in pickles.items():
        _check_globals(data, frozenset(allowed), f"{what} {path} ({name})")


def check_pickle(path: Path, allowed: Iterable[str], what: str) -> None:
    """Raise UnsafePickleError naming ``path`` unless every global of the pickle there is in
    ``allowed`` (``"module name"`` strings); ``what`` says what the file is for the message."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UnsafePickleError(f"{what} {path} is unreadable: {exc}") from exc
    _check_globals(data, frozenset(allowed), f"{what} {path}")


def _check_globals(data: bytes, allowed: frozenset[str], what: str) -> None:
    try:
        names = globals_of(data)
    except UnsafePickleError as exc:
        raise UnsafePickleError(f"{what} was not read: {exc}") from exc
    unknown = sorted({n for n in names if n not in allowed})
    if unknown:
        raise UnsafePickleError(
            f"{what} names {unknown}, which a checkpoint of this kind never holds; it was not "
            "read, since unpickling it could run code. Use a checkpoint from a source you trust"
        )
