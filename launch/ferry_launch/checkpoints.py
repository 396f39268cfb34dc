"""The checkpoint folder as the launcher sees it (--checkpoint-dir, --resume), before anything
starts.

The servers write, verify and restore checkpoints; the launcher only reads names, CURRENT and the
manifests' JSON, to refuse early with a clear message. Layout (ferry-ps --checkpoint-dir):
CURRENT (one line naming the newest manifest), MANIFEST-<20-digit step> (JSON: "step",
"meaning", "shards": [{"file", "bytes", "crc32"}], a delta shard with its chain in "base": [...])
and the shard files. `ferry-ps --restore`
tries the manifest CURRENT names, then the other manifests, newest step first, and takes the
first that verifies; find_checkpoint() follows the same order, checking names, sizes and each
shard file's CRC-32 against its manifest (the servers also check every block inside).
"""

import json
import os
import re
import zlib

from .common import LaunchError

MANIFEST_RE = re.compile(r"^MANIFEST-(\d{20})$")
SHOWN_ENTRIES = 5  # entries of a folder named in an error, at most


def _listing(folder, flag):
    if not os.path.exists(folder):
        raise LaunchError(f"{flag} {folder}: no such folder")
    if not os.path.isdir(folder):
        raise LaunchError(f"{flag} {folder}: not a folder")
    try:
        return sorted(os.listdir(folder))
    except OSError as e:
        raise LaunchError(f"{flag} {folder}: cannot list it: {e.strerror}") from None


def _current(folder):
    """The first line of CURRENT, stripped; None when there is no CURRENT (or it is unreadable
    or empty)."""
    try:
        with open(os.path.join(folder, "CURRENT"), encoding="utf-8", errors="replace") as f:
            return f.readline().strip() or None
    except OSError:
        return None


def _crc32(path):
    """zlib's CRC-32 of the whole file, read in 4 MiB pieces."""
    crc = 0
    with open(path, "rb") as f:
        while True:
            piece = f.read(4 << 20)
            if not piece:
                return crc
            crc = zlib.crc32(piece, crc)


def _check_manifest(folder, name):
    """(step, None) when manifest `name` and its shard files are there with the sizes and
    CRC-32s it gives; (None, why not) otherwise. Sizes first: a short file costs no read."""
    try:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        return None, f"{name}: cannot read it: {e.strerror}"
    except ValueError:
        return None, f"{name}: not valid JSON"
    step = data.get("step") if isinstance(data, dict) else None
    shards = data.get("shards") if isinstance(data, dict) else None
    if isinstance(step, bool) or not isinstance(step, int) or not isinstance(shards, list) \
            or not shards:
        return None, f"{name}: no \"step\" or no \"shards\" in it"
    # A delta shard (format 2) lists its chain in "base": those files are checked alike.
    files = []
    for s in shards:
        base = s.get("base", []) if isinstance(s, dict) else []
        if not isinstance(base, list):
            return None, f"{name}: a shard's \"base\" is not a list of files"
        files.extend(base)
        files.append(s)
    shards = files
    for s in shards:
        file = s.get("file") if isinstance(s, dict) else None
        if not isinstance(file, str) or not file or "/" in file:
            return None, f"{name}: a shard entry without a plain \"file\" name"
        try:
            size = os.path.getsize(os.path.join(folder, file))
        except OSError:
            return None, f"{name}: shard file {file} is missing"
        want = s.get("bytes")
        if isinstance(want, int) and not isinstance(want, bool) and size != want:
            return None, f"{name}: shard file {file} has {size} bytes, the manifest says {want}"
    for s in shards:
        want = s.get("crc32")
        if not isinstance(want, int) or isinstance(want, bool):
            return None, f"{name}: shard file {s['file']} has no \"crc32\" in the manifest"
        try:
            got = _crc32(os.path.join(folder, s["file"]))
        except OSError as e:
            return None, f"{name}: shard file {s['file']}: cannot read it: {e.strerror}"
        if got != want:
            return None, (f"{name}: shard file {s['file']} is damaged: its CRC-32 is {got}, the "
                          f"manifest says {want}")
    return step, None


def _entries_text(names):
    shown = ", ".join(names[:SHOWN_ENTRIES])
    more = f", and {len(names) - SHOWN_ENTRIES} more" if len(names) > SHOWN_ENTRIES else ""
    return f"{len(names)} entr{'y' if len(names) == 1 else 'ies'} ({shown}{more})"


def find_checkpoint(folder, flag="--resume"):
    """What `ferry-ps --restore` would start from, as far as names, sizes and CRCs tell: the manifest
    CURRENT names, else the newest other MANIFEST-<step>. Returns (manifest name, step, passed
    over: [why each earlier candidate was skipped]). Raises LaunchError saying what the folder
    holds when there is none."""
    names = _listing(folder, flag)
    manifests = sorted((n for n in names if MANIFEST_RE.match(n)), reverse=True)
    current = _current(folder)
    candidates = ([current] if current else []) + [m for m in manifests if m != current]
    skipped = []
    if current and not MANIFEST_RE.match(current):
        skipped.append(f"CURRENT names '{current}', not a MANIFEST-<step> file")
        candidates.remove(current)
    elif current and current not in names:
        skipped.append(f"CURRENT names {current}, which is not there")
        candidates.remove(current)
    for name in candidates:
        step, why = _check_manifest(folder, name)
        if why is None:
            return name, step, skipped
        skipped.append(why)
    if not names:
        found = "the folder is empty"
    elif not manifests and "CURRENT" not in names:
        found = f"it holds {_entries_text(names)} but no CURRENT and no MANIFEST-<step> file"
    else:
        found = "; ".join(skipped) if skipped else "no MANIFEST-<step> file"
    raise LaunchError(f"{flag} {folder}: no checkpoint to resume from: {found} (a job started "
                      "with --checkpoint-dir DIR --checkpoint-every N writes CURRENT, "
                      "MANIFEST-<step> and shard files there)")


def prepare_new_folder(folder):
    """--checkpoint-dir for a new job: created if missing, must be writable, and must hold no
    checkpoint (a server restarted later takes the newest one there, which would be another
    job's). Raises LaunchError."""
    flag = "--checkpoint-dir"
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise LaunchError(f"{flag} {folder}: cannot create it: {e.strerror}") from None
    names = _listing(folder, flag)
    held = [n for n in names if n == "CURRENT" or MANIFEST_RE.match(n)]
    if held:
        current = _current(folder)
        what = f"CURRENT names {current}" if current else _entries_text(held)
        raise LaunchError(f"{flag} {folder} already holds a checkpoint ({what}): --resume "
                          f"{folder} continues that job; a new job needs a new or empty folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise LaunchError(f"{flag} {folder}: not writable")
