"""What the compile service accepts as a model: one ONNX file, or a zip of an ONNX file and the external data
files it names. jobs.py opens every upload through `opened_model`, in the import process and in the compile
workers, so both see the same model and the same refusals."""

from __future__ import annotations

import contextlib
import stat
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import onnx

from compiler.errors import ModelError
from compiler.frontend.onnx import model_in_folder

ZIP_MAGIC = b"PK\x03\x04"
MAX_MEMBERS = 256
CHUNK_BYTES = 1 << 20


@contextlib.contextmanager
def opened_model(upload: Path, max_extracted_bytes: int) -> Iterator[bytes | onnx.ModelProto]:
    """What compile_model takes for an upload: the bytes of a single ONNX file (whose external data, if it names
    any, is refused: it could name any file on the server), or for a zip the model read from its extracted
    folder with its external data loaded."""
    with upload.open("rb") as stream:
        is_zip = stream.read(len(ZIP_MAGIC)) == ZIP_MAGIC
    if not is_zip:
        yield upload.read_bytes()
        return
    with tempfile.TemporaryDirectory(prefix="tessel-upload-") as folder:
        yield _load(extract(upload, Path(folder), max_extracted_bytes))


def _member_path(info: zipfile.ZipInfo) -> PurePosixPath:
    name = info.filename
    path = PurePosixPath(name)
    if not name or "\\" in name or path.is_absolute() or ".." in path.parts or ":" in name or "\0" in name:
        raise ModelError(f"the zip holds {name!r}, a path outside its own folder; zip the model's folder as it is")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise ModelError(f"the zip holds {name!r} as a symbolic link; zip the files themselves")
    if info.flag_bits & 0x1:
        raise ModelError(f"the zip holds {name!r} encrypted; upload an unencrypted zip")
    return path


def extract(upload: Path, folder: Path, max_extracted_bytes: int) -> Path:
    """Extract the zip `upload` into `folder`, refusing paths that leave it, links, and more than
    `max_extracted_bytes` in all (counted as the bytes are written, so a zip bomb stops at the limit whatever
    its headers claim); return the path of its one .onnx file."""
    try:
        archive = zipfile.ZipFile(upload)
    except (zipfile.BadZipFile, OSError) as error:
        raise ModelError(f"the upload starts like a zip but cannot be read as one ({error})") from None
    with archive:
        members = archive.infolist()
        if len(members) > MAX_MEMBERS:
            raise ModelError(f"the zip holds {len(members)} files; this server takes at most {MAX_MEMBERS}")
        written = 0
        for info in members:
            relative = _member_path(info)
            if info.is_dir():
                continue
            destination = folder.joinpath(*relative.parts)
            destination.parent.mkdir(parents=True, exist_ok=True)
            try:
                with archive.open(info) as source, destination.open("xb") as target:
                    while chunk := source.read(CHUNK_BYTES):
                        written += len(chunk)
                        if written > max_extracted_bytes:
                            raise ModelError(
                                f"the zip holds more than this server's {max_extracted_bytes / 2**20:g} MiB "
                                "once extracted; compile the model locally with `tessel compile`"
                            )
                        target.write(chunk)
            except FileExistsError:
                raise ModelError(f"the zip holds {info.filename!r} twice") from None
            except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError) as error:
                raise ModelError(f"the zip's {info.filename!r} cannot be extracted ({error})") from None
    return model_in_folder(folder)


def _load(model_path: Path) -> onnx.ModelProto:
    """The model with its external data read in, after checking every data file it names is a file beside it."""
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as error:
        raise ModelError(f"{model_path.name} in the zip is not a valid ONNX model ({error})") from None
    base = model_path.parent.resolve()
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if not onnx.external_data_helper.uses_external_data(tensor):
            continue
        location = {entry.key: entry.value for entry in tensor.external_data}.get("location", "")
        path = (base / location).resolve()
        if not location or not path.is_relative_to(base):
            raise ModelError(f"tensor {tensor.name!r} names data file {location!r}, outside the model's folder")
        if not path.is_file():
            raise ModelError(f"tensor {tensor.name!r} names data file {location!r}, which the zip does not hold")
    try:
        onnx.external_data_helper.load_external_data_for_model(model, str(base))
    except Exception as error:
        raise ModelError(f"the external data of {model_path.name} cannot be read ({error})") from None
    return model


__all__ = ["extract", "opened_model"]
