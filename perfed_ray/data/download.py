"""Downloading a data set that is missing, all or nothing.

torchvision makes its folders first and downloads into them, so a download that fails
(no network, a typing error in `data_root`) leaves empty folders behind, and its error
is a dump of every mirror it tried. Here the download goes into a hidden folder inside
the data root and is moved into place only once complete; a failure removes every
folder it made and becomes one line saying what is missing and where to get it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from perfed_ray.errors import DataError


def reason(err: BaseException) -> str:
    """A download error in a few words: urllib's own reason where torchvision wrapped
    it in its list of mirrors (``<urlopen error [Errno -2] Name or service not known>``)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    urllib = [line for line in lines if line.startswith("<")]
    return (urllib or lines or [type(err).__name__])[-1 if urllib else 0]


def _first_missing(folder: Path) -> Path | None:
    """The outermost folder of `folder`'s path that does not exist yet (None if it does)."""
    missing = None
    for parent in (folder, *folder.parents):
        if parent.exists():
            return missing
        missing = parent
    return missing


def fetch(
    root: Path, get: Callable[[Path], None], moves: list[str], missing: str, how: str
) -> None:
    """Run `get(staging)`, which downloads into the folder `staging` as it would into the
    data root, then move its `moves` (paths relative to it) into `root`. On failure,
    nothing is left: not the staging folder, not the data root if this made it; the
    DataError says what is `missing` (``MNIST not found under ... (missing ...)``) and
    `how` to get it."""
    made = _first_missing(root)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".download-", dir=root))
    try:
        get(staging)
    except Exception as err:  # torchvision raises RuntimeError, URLError, OSError ...
        shutil.rmtree(staging, ignore_errors=True)
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise DataError(f"{missing}, and downloading failed ({reason(err)}): {how}") from None
    for part in moves:
        target = root / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir():  # a folder of files: add them beside any already there
            for item in (staging / part).iterdir():
                item.replace(target / item.name)
        else:
            (staging / part).replace(target)
    shutil.rmtree(staging, ignore_errors=True)
