"""What a store key may be: one rule for local directories and S3 alike.

A key names exactly one object. Anything that a file system or an S3-compatible gateway could read
as another name (``..`` and ``.`` components, ``//``, a leading ``/``, a backslash, a NUL, a name
longer than the store keeps, a control or invisible formatting character) is refused before any
request is made, with one line saying what is wrong with it. Unicode that is not in a normal form
(a name macOS wrote in NFD, full-width or superscript characters) is a name like any other: both
S3 and the file systems loadmaster deletes on keep names as given, byte for byte, so the exact key
names exactly one object; refusing it would make such a dataset unreadable.
"""

from __future__ import annotations

import unicodedata

from backend.errors import StoreError

#: S3's limit on a whole key, in UTF-8 bytes (a local path this long is refused too).
MAX_KEY_BYTES = 1024
#: The longest file name (one component) POSIX file systems keep (NAME_MAX).
MAX_NAME_BYTES = 255


def _shown(key: str) -> str:
    return repr(key if len(key) <= 80 else key[:77] + "...")


def key_problem(key: object, *, acting: bool = True) -> str | None:
    """Why ``key`` is not a store key, or None when it is one.

    ``acting=False`` (a read, a listing) leaves out the rule on control and formatting characters:
    such a name exists, and is listed (shown cleaned) so the operator sees it; only a delete or a
    write refuses it. The rules that decide *which* object a key names apply to every use."""
    if not isinstance(key, str):
        return f"not text ({type(key).__name__})"
    if not key:
        return "an empty key"
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return "not valid UTF-8 (a file name the file system does not spell in UTF-8)"
    if "\x00" in key:
        return "it holds a NUL byte"
    if "\\" in key:
        return "it holds a backslash (a path separator on some stores)"
    if acting and any(unicodedata.category(c) in ("Cc", "Cf") for c in key):
        return "it holds a control or invisible formatting character"
    if size > MAX_KEY_BYTES:
        return f"it is {size} bytes long (the limit is {MAX_KEY_BYTES})"
    if key.startswith("/"):
        return "it starts with '/' (keys are relative to the store root)"
    for part in key.split("/"):
        if part == "":
            return "it has an empty component ('//' or a trailing '/')"
        if part in (".", ".."):
            return f"it has a {part!r} component"
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            return f"a component is longer than {MAX_NAME_BYTES} bytes"
    return None


def check_key(key: str, store: str, *, allow_empty: bool = False, acting: bool = True) -> str:
    """``key`` itself when it is a store key (``""`` too with ``allow_empty``: the store root);
    otherwise a :class:`StoreError` naming the key and what to fix."""
    if allow_empty and key == "":
        return key
    why = key_problem(key, acting=acting)
    if why is not None:
        raise StoreError(f"{store}: refused key {_shown(str(key))}: {why}; name the object by its exact key")
    return key


def check_sub(sub: str, store: str, *, acting: bool = False) -> str:
    """A folder to list (``""`` = the root; one trailing ``/`` allowed): the folder without it."""
    if sub.endswith("/") and not sub.endswith("//"):
        sub = sub[:-1]
    return check_key(sub, store, allow_empty=True, acting=acting)
