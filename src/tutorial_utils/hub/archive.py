"""A dataset archive from a URL: download (with a progress bar), check, extract safely.

The platform guide's third data source, besides a local folder and a Hub repo: a ``.tar``,
``.tar.gz``/``.tgz`` or ``.zip`` of a LeRobot v2.1 dataset behind an ``http(s)://`` or
``file://`` URL. The download goes to a ``.part`` file beside the destination, the optional
sha256 is checked before anything is extracted, and extraction refuses members that would land
outside the destination (absolute paths, ``..``, links, devices). The dataset appears at
``dest`` only once it is complete (extracted into a temporary folder, then renamed). Whether it
is a valid v2.1 dataset is the data stage's check (``python -m tutorial_utils dataset
import-url`` runs it).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import zipfile
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from tutorial_utils.errors import DiskFull, TutorialError, is_disk_full
from tutorial_utils.secrets import redact

_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")


class ArchiveError(TutorialError, ValueError):
    """A dataset archive that cannot be fetched, does not match its checksum, or is unsafe."""


def _kind(url: str) -> str:
    name = PurePosixPath(urlsplit(url).path).name.lower()
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return "zip" if suffix == ".zip" else "tar"
    raise ArchiveError(
        f"{redact(url)}: cannot tell the archive type from the name. Fix: use a URL ending in {', '.join(_SUFFIXES)}"
    )


def fetch(url: str, path: Path, progress: bool | None = None, timeout_s: float = 30.0) -> int:
    """Stream ``url`` into ``path`` (a tqdm bar on stderr when ``progress``); returns the bytes."""
    import http.client
    import sys
    import urllib.error
    import urllib.request

    from tqdm.auto import tqdm

    if urlsplit(url).scheme not in ("http", "https", "file"):
        raise ArchiveError(f"{redact(url)}: only http(s):// and file:// URLs are fetched. Fix: give such a URL")
    if progress is None:
        progress = sys.stderr.isatty()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp, open(path, "wb") as out:
            length = resp.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            with tqdm(total=total, unit="B", unit_scale=True, desc=path.name, disable=not progress) as bar:
                done = 0
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
                    done += len(chunk)
                    bar.update(len(chunk))
            if total is not None and done != total:
                raise ArchiveError(
                    f"{redact(url)}: the response was cut short ({done} of {total} bytes). Fix: rerun the import"
                )
            return done
    except http.client.IncompleteRead as exc:
        raise ArchiveError(
            f"{redact(url)}: the response was cut short ({len(exc.partial)} bytes then the connection closed). "
            "Fix: rerun the import"
        ) from None
    except urllib.error.HTTPError as exc:
        raise ArchiveError(
            f"{redact(url)}: HTTP {exc.code} {exc.reason}. Fix: check the URL (and that the file is public)"
        ) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        if isinstance(exc, OSError) and is_disk_full(exc):
            raise DiskFull(path, "while downloading the archive") from None
        reason = getattr(exc, "reason", exc)
        raise ArchiveError(f"{redact(url)}: cannot fetch it ({reason}). Fix: check the URL and the network") from None
    except OSError as exc:
        if is_disk_full(exc):
            raise DiskFull(path, "while downloading the archive") from None
        raise


def _safe_name(archive: Path, name: str) -> str:
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or (p.parts and ":" in p.parts[0]):
        raise ArchiveError(
            f"{archive}: member {name!r} would be written outside the destination (absolute path or '..'). "
            "Fix: this archive is unsafe; ask its author for a plain archive of the dataset folder"
        )
    return str(p)


def extract(archive: Path, into: Path, kind: str) -> list[str]:
    """Extract ``archive`` into ``into`` after checking every member; returns the file names."""
    names = []
    if kind == "zip":
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                names.append(_safe_name(archive, info.filename))
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    raise ArchiveError(
                        f"{archive}: member {info.filename!r} is a symbolic link. Fix: archive files only"
                    )
            z.extractall(into)
        return [n for n in names if not n.endswith("/")]
    with tarfile.open(archive) as t:
        members = t.getmembers()
        for m in members:
            names.append(_safe_name(archive, m.name))
            if not (m.isfile() or m.isdir()):
                raise ArchiveError(
                    f"{archive}: member {m.name!r} is a link or a device, not a file. Fix: archive files only"
                )
        t.extractall(into, members=members, filter="data")
    return [m.name for m in members if m.isfile()]


def dataset_root(folder: Path) -> Path:
    """The folder holding ``meta/info.json``: ``folder`` itself or its one top-level folder."""
    if (folder / "meta" / "info.json").is_file():
        return folder
    subs = [p for p in folder.iterdir() if p.is_dir()]
    if len(subs) == 1 and (subs[0] / "meta" / "info.json").is_file():
        return subs[0]
    raise ArchiveError(
        f"the archive holds no LeRobot dataset (no meta/info.json at its top or in its one top-level "
        f"folder; found {sorted(p.name for p in folder.iterdir())[:8]}). Fix: archive the dataset folder itself"
    )


def fetch_archive(
    url: str, dest: str | os.PathLike, sha256: str | None = None, progress: bool | None = None, timeout_s: float = 30.0
) -> dict:
    """Download the archive at ``url``, check ``sha256`` (if given), extract it safely and move
    the dataset folder to ``dest`` (which must not exist yet). Returns a summary."""
    dest = Path(dest)
    if dest.exists():
        raise ArchiveError(f"{dest} already exists. Fix: choose a new destination, or delete it first")
    kind = _kind(url)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.parent / f".{dest.name}.part"
    tmp = dest.parent / f".{dest.name}.extracting"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        size = fetch(url, part, progress=progress, timeout_s=timeout_s)
        digest = hashlib.sha256()
        with open(part, "rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
        got = digest.hexdigest()
        if sha256 and got != sha256.lower():
            raise ArchiveError(
                f"{redact(url)}: sha256 {got} differs from the expected {sha256}: the file is corrupted or "
                "another version. Fix: rerun the import; if it persists, check the checksum you were given"
            )
        tmp.mkdir()
        try:
            files = extract(part, tmp, kind)
        except (tarfile.TarError, zipfile.BadZipFile) as exc:
            raise ArchiveError(f"{redact(url)}: not a readable {kind} archive ({exc}). Fix: check the URL") from None
        root = dataset_root(tmp)
        root.rename(dest)
    except OSError as exc:
        if is_disk_full(exc):
            raise DiskFull(dest, "while fetching or extracting the archive") from None
        raise
    finally:
        part.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return {"url": redact(url), "dest": str(dest), "bytes": size, "sha256": got, "files": len(files)}
