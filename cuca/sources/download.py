"""Downloads into the shared Hugging Face cache: hub files through `huggingface_hub`, plain URLs through a small
resumable downloader. Every failure is a SourceError that says what to do.

The environment is read at call time (HF_ENDPOINT, HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE), not when
huggingface_hub was imported, so a process can change it (and tests can point it at a local server).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SourceError

_TRUE = {"1", "on", "yes", "true"}
SHA256 = re.compile(r"[0-9a-f]{64}")  # a hex sha256 digest


def hub_cache_dir() -> Path:
    """The shared Hugging Face hub cache, with huggingface_hub's precedence: HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE,
    HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub."""
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(key):
            return Path(os.environ[key]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def offline() -> bool:
    """HF_HUB_OFFLINE=1 (or TRANSFORMERS_OFFLINE=1): use cached files only, never touch the network."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in _TRUE


def _progress_class(progress: bool) -> Any:
    from tqdm.auto import tqdm

    if progress:
        return tqdm

    class _Silent(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return _Silent


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _check(path: Path, what: str, size: int | None, sha256: str | None, full: bool, remove: list[Path]) -> None:
    """Size, then sha256 (by the file's content when `full`, else trusting a content-addressed blob name equal to
    it). On a mismatch the files in `remove` are deleted, so nothing wrong stays in the cache."""
    problem = None
    actual_size = path.stat().st_size
    if size is not None and actual_size != size:
        problem = f"size mismatch for {what}: expected {size} bytes, got {actual_size}"
    elif sha256 is not None:
        blob_name = path.resolve().name
        if full or blob_name != sha256:
            actual = sha256_file(path)
            if actual != sha256:
                problem = f"sha256 mismatch for {what}: expected {sha256}, got {actual}"
    if problem is not None:
        for p in remove:
            p.unlink(missing_ok=True)
        raise SourceError(f"{problem}; the file was removed from the cache (retry, or report a changed upload)")


def download_hub(
    repo: str,
    file: str,
    revision: str | None = None,
    sha256: str | None = None,
    size: int | None = None,
    progress: bool = True,
) -> Path:
    """A file of a Hugging Face repo, from the shared cache or downloaded into it; verified when the size or
    sha256 is known."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    revision = revision or "main"
    cache = hub_cache_dir()
    ref = f"hf:{repo}/{file}" + (f"@{revision}" if revision != "main" else "")
    is_offline = offline()
    endpoint = hub_endpoint()
    try:
        cached_before = try_to_load_from_cache(repo, file, cache_dir=cache, revision=revision)
        fresh = not isinstance(cached_before, str)
        verified = False
        if fresh and not is_offline:
            hub_file = _HubFile(repo, file, revision, endpoint, cache, ref)
            verified = _fetch_blob_resumably(hub_file, sha256, size, progress)
        got = hf_hub_download(
            repo,
            file,
            revision=revision,
            cache_dir=cache,
            endpoint=endpoint,
            local_files_only=is_offline,
            tqdm_class=_progress_class(progress),
        )
    except GatedRepoError as e:
        raise SourceError(
            f"{ref}: the repo is gated; accept its licence on the hub and log in (hf auth login), then retry ({e})"
        ) from None
    except RepositoryNotFoundError:
        raise SourceError(
            f"{ref}: repository {repo!r} not found at {endpoint} (check the name; private repos need hf auth login)"
        ) from None
    except RevisionNotFoundError:
        raise SourceError(
            f"{ref}: revision {revision!r} not found in {repo!r} (check the branch, tag or commit)"
        ) from None
    except LocalEntryNotFoundError:
        if is_offline:
            raise SourceError(
                f"{ref} is not in the cache at {cache} and offline mode is on (HF_HUB_OFFLINE=1): run "
                f"`cuca pull {ref}` with network access first, or unset HF_HUB_OFFLINE"
            ) from None
        raise SourceError(
            f"cannot reach the Hugging Face hub at {endpoint} to download {ref}, and it is not in the cache at "
            f"{cache}: check the network (or HF_ENDPOINT), or copy the file and pass its path"
        ) from None
    except EntryNotFoundError:
        raise SourceError(f"{ref}: file {file!r} not found in {repo}@{revision} (check the file name)") from None
    except HfHubHTTPError as e:
        raise SourceError(f"{ref}: the hub at {endpoint} answered with an error: {e}") from None
    except ValueError as e:  # a repo id or file name the client refuses
        raise SourceError(f"{ref}: {e}") from None
    except OSError as e:  # an incomplete transfer after retries, or a full disk
        raise SourceError(f"{ref}: download failed ({e}); run the same command again to retry") from None
    path = Path(got)
    expect = sha256
    if expect is None and fresh and not verified and SHA256.fullmatch(path.resolve().name):
        expect = path.resolve().name  # an LFS blob is named by its sha256, which the hub sent as its ETag
    _check(path, ref, size, expect, full=fresh and not verified, remove=[path.resolve(), path])
    return path


@dataclass(frozen=True)
class _HubFile:
    """Which hub file, and where it goes: repo, file and revision on the hub at `endpoint`, the local hub `cache`,
    and `ref`, the name errors give it."""

    repo: str
    file: str
    revision: str
    endpoint: str
    cache: Path
    ref: str


def _fetch_blob_resumably(hub_file: _HubFile, sha256: str | None, size: int | None, progress: bool) -> bool:
    """Download a plain-HTTP hub file into the cache's blob store so that an interrupted run can be resumed:
    the bytes go to `blobs/<etag>.cuca-incomplete`, kept when the transfer breaks off, continued with a Range
    request by the next run, checked, and only then moved to `blobs/<etag>`, where hf_hub_download finds the blob
    and links it into the snapshot. Files served through Xet are left to hf_hub_download. Returns whether it
    downloaded and checked the file; any trouble reaching the hub is left for hf_hub_download to report."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get, is_xet_available
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    h = hub_file
    url = hf_hub_url(h.repo, h.file, revision=h.revision, endpoint=h.endpoint)
    try:
        meta = get_hf_file_metadata(url, endpoint=h.endpoint)
    except Exception:
        return False
    if meta.etag is None or meta.commit_hash is None or (meta.xet_file_data is not None and is_xet_available()):
        return False
    folder = "models--" + h.repo.replace("/", "--")
    blob = h.cache / folder / "blobs" / meta.etag
    if blob.exists():
        return False
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock = h.cache / ".locks" / folder / f"{meta.etag}.lock"  # the lock hf_hub_download takes for this blob
    lock.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(lock):
        if blob.exists():  # another process finished it while we waited
            return False
        part = blob.with_name(blob.name + ".cuca-incomplete")
        have = part.stat().st_size if part.is_file() else 0
        if meta.size is not None and have > meta.size:  # not a prefix of this file: start over
            part.unlink()
            have = 0
        source = meta.location if meta.xet_file_data is None else url
        headers = build_hf_headers()
        if urllib.parse.urlsplit(source).netloc != urllib.parse.urlsplit(url).netloc:
            headers.pop("authorization", None)  # a signed CDN URL: the token stays with the hub
        # an LFS file's ETag is its sha256: the hub's own hash checks the bytes when the caller knows none
        expect = sha256 or (meta.etag if SHA256.fullmatch(meta.etag) else None)
        for resume in (have, 0) if have else (0,):
            try:
                with open(part, "ab" if resume else "wb") as f:
                    http_get(source, f, resume_size=resume, headers=headers, expected_size=meta.size,
                             displayed_filename=h.file, tqdm_class=_progress_class(progress))
            except Exception as e:
                got = part.stat().st_size if part.is_file() else 0
                raise SourceError(
                    f"download of {h.ref} broke off at {got} of {meta.size} bytes ({e}); run the same command again "
                    "to resume"
                ) from None
            try:
                _check(part, h.ref, size, expect, full=True, remove=[part])
                break
            except SourceError:
                if not resume:
                    raise  # a whole download that does not match: the upload, not a kept partial, is wrong
        os.replace(part, blob)
    return True


def url_cache_path(url: str) -> Path:
    """Where a URL's file is kept: <hub cache>/cuca-urls/<hash of the URL>/<file name>."""
    parts = urllib.parse.urlsplit(url)
    name = os.path.basename(parts.path) or "download.gguf"
    key = hashlib.sha256(urllib.parse.urlunsplit(parts._replace(fragment="")).encode()).hexdigest()[:24]
    return hub_cache_dir() / "cuca-urls" / key / name


def download_url(url: str, sha256: str | None = None, progress: bool = True, timeout: float = 30.0) -> Path:
    """A file behind an http(s) URL, kept in the shared cache. One process at a time fetches a URL (a file lock
    under the cache's .locks/); an interrupted download leaves `<file>.incomplete` and the validator of the
    response it came from, and the next call resumes it with a Range request that holds only while the file is
    unchanged (If-Range); anything that cannot be shown complete is not cached as complete."""
    from huggingface_hub.utils import WeakFileLock

    final = url_cache_path(url)
    if final.is_file() and _stamped(final, sha256):
        return final
    if not final.is_file() and offline():
        raise SourceError(
            f"{url} is not in the cache at {final.parent} and offline mode is on (HF_HUB_OFFLINE=1): run "
            f"`cuca pull {url}` with network access first, or unset HF_HUB_OFFLINE"
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    lock = hub_cache_dir() / ".locks" / "cuca-urls" / f"{final.parent.name}.lock"  # one per URL, across processes
    lock.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(lock):
        if final.is_file():  # cached before, or by another process while we waited
            if not _stamped(final, sha256):
                _check(final, url, None, sha256, full=True, remove=[final, _stamp_path(final)])
                _stamp(final, sha256)
            return final
        resumed = _fetch_url(url, final, sha256, progress, timeout, resume=True)
        if resumed is None:  # the kept partial was not part of this file: once more, from the start
            _fetch_url(url, final, sha256, progress, timeout, resume=False)
    return final


def _stamp_path(final: Path) -> Path:
    return final.with_name(final.name + ".sha256")


def _stamped(final: Path, sha256: str | None) -> bool:
    """Whether `final` was checked against `sha256` (always, when none is asked for) and is unchanged in size."""
    if sha256 is None:
        return True
    try:
        digest, size = _stamp_path(final).read_text().split()[:2]
        return digest == sha256 and int(size) == final.stat().st_size
    except (OSError, ValueError):
        return False


def _stamp(final: Path, sha256: str | None) -> None:
    if sha256 is not None:
        tmp = _stamp_path(final).with_suffix(".sha256.tmp")
        tmp.write_text(f"{sha256} {final.stat().st_size}\n")
        os.replace(tmp, _stamp_path(final))


def _validator(headers: Any) -> str | None:
    """What If-Range can name for this response: a strong ETag, else Last-Modified."""
    etag = headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return str(etag)
    modified = headers.get("Last-Modified")
    return str(modified) if modified else None


def _fetch_url(url: str, final: Path, sha256: str | None, progress: bool, timeout: float, resume: bool) -> bool | None:
    """Download `url` into `final` (the caller holds its lock). Returns whether a partial was resumed, or None when
    the kept partial turned out not to belong to this file (it is gone then; the caller starts over)."""
    part = final.with_name(final.name + ".incomplete")
    since = part.with_name(part.name + ".validator")  # the validator of the response the partial came from
    have = part.stat().st_size if resume and part.is_file() else 0
    validator = since.read_text().strip() if have and since.is_file() else None
    if not validator:  # nothing shows the partial is part of today's file: do not resume it
        have = 0
    headers = {"Range": f"bytes={have}-", "If-Range": validator} if have and validator else {}
    total: int | None = None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            if have and resp.status == 206:
                m = re.fullmatch(r"bytes (\d+)-\d+/(\d+)", resp.headers.get("Content-Range", "").strip())
                if m is None or int(m[1]) != have:
                    _discard(part, since)
                    return None
                total = int(m[2])
            else:  # a whole body: the file changed (If-Range failed), or the server ignores ranges
                have = 0
                length = resp.headers.get("Content-Length")
                total = int(length) if length is not None and length.isdigit() else None
                chunked = "chunked" in resp.headers.get("Transfer-Encoding", "").lower()
                if total is None and not chunked and sha256 is None:
                    raise SourceError(f"{url}: the server sent no Content-Length, so a download that breaks off "
                                      "cannot be told from a complete one; add #sha256=<hash> to the URL")
                v = _validator(resp.headers)
                since.unlink(missing_ok=True)
                if v is not None:
                    since.write_text(v + "\n")
            _receive(resp, part, have, total, progress)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing past what we have, and unchanged (If-Range held)
            m = re.fullmatch(r"bytes \*/(\d+)", (e.headers.get("Content-Range") or "").strip())
            if m is None or int(m[1]) != have:  # longer than the file, or a size we cannot confirm
                _discard(part, since)
                return None
            total = have
        else:
            raise SourceError(f"{url}: the server answered {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        kept = f"; {part.stat().st_size} bytes kept, run again to resume" if part.is_file() else ""
        raise SourceError(f"cannot download {url}: {reason}{kept}") from None
    got = part.stat().st_size
    if total is not None and got < total:
        raise SourceError(f"download of {url} stopped at {got} of {total} bytes; run again to resume")
    if total is not None and got > total:
        _discard(part, since)
        return None
    try:
        _check(part, url, None, sha256, full=True, remove=[part, since])
    except SourceError:
        if have:  # the kept bytes were wrong: start over rather than fail
            return None
        raise
    os.replace(part, final)
    since.unlink(missing_ok=True)
    _stamp(final, sha256)
    return bool(have)


def _discard(part: Path, since: Path) -> None:
    part.unlink(missing_ok=True)
    since.unlink(missing_ok=True)


def _receive(resp: Any, part: Path, have: int, total: int | None, progress: bool) -> None:
    bar = _progress_class(progress)(total=total, initial=have, unit="B", unit_scale=True, desc=part.name,
                                    file=sys.stderr)
    with bar, open(part, "ab" if have else "wb") as f:
        while chunk := resp.read(1 << 20):
            f.write(chunk)
            bar.update(len(chunk))
