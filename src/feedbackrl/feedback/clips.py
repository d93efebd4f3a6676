"""Clips: media an item shows instead of text, e.g. the two trajectory segments of a segment-pair item.

An admin uploads a clip to a project (`POST /api/projects/{id}/clips`, base64 in JSON) and gets back its
reference, ``"clip:<sha256>"``; an item whose responses are two references is a segment pair, shown as two
animated clips side by side and labelled like any pair (1 / 2 / t tie / s skip, the same export). Clips are
content-addressed per project: uploading the same bytes twice stores them once. A clip is served only to
those who may see its project (`GET /projects/{id}/clips/<sha256>`, the page's cookie or a bearer token),
the same 404 for a foreign project as for a missing clip.

Only animated GIF is accepted: every browser plays it in an ``<img>`` (the page's `img-src 'self'` policy),
with no codec to negotiate; Debian's Chromium, for one, ships without H.264.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

from sqlalchemy import select
from sqlalchemy.orm import Session

from feedbackrl.feedback.store import Clip, FeedbackError, NotFound, Project

PREFIX = "clip:"
CLIP_MAX = 2 * 1024 * 1024  # bytes of one clip (its base64 fits the app's 4 MiB body limit)
MEDIA_TYPES = {"image/gif": (b"GIF87a", b"GIF89a")}  # media type -> the magic bytes its files start with
DIGEST = re.compile(r"^[0-9a-f]{64}$")


def is_clip(response: str) -> bool:
    return response.startswith(PREFIX)


def decode(data_b64: str) -> bytes:
    try:
        return base64.b64decode(data_b64, validate=True)
    except (binascii.Error, ValueError):
        raise FeedbackError("clip 'data' must be base64 (RFC 4648, no line breaks)") from None


def add_clip(s: Session, project: Project, data: bytes, media_type: str = "image/gif") -> tuple[str, bool]:
    """Store `data` in `project` -> (its reference "clip:<sha256>", whether it was new). Refuses an unknown
    media type, bytes that are not of that type, an empty or oversized clip."""
    if media_type not in MEDIA_TYPES:
        raise FeedbackError(f"clip media_type must be one of {', '.join(MEDIA_TYPES)}; got {media_type!r:.40}")
    if not data or len(data) > CLIP_MAX:
        raise FeedbackError(f"a clip must be 1..{CLIP_MAX} bytes; got {len(data)}")
    if not data.startswith(MEDIA_TYPES[media_type]):
        raise FeedbackError(f"clip data is not {media_type} (it starts {data[:6]!r}, not "
                            f"{' or '.join(map(repr, MEDIA_TYPES[media_type]))})")
    digest = hashlib.sha256(data).hexdigest()
    found = s.scalar(select(Clip.id).where(Clip.project_id == project.id, Clip.digest == digest))
    if found is None:
        s.add(Clip(project_id=project.id, digest=digest, media_type=media_type, data=data))
        s.flush()
    return PREFIX + digest, found is None


def get_clip(s: Session, project: Project, digest: str) -> Clip:
    clip = s.scalar(select(Clip).where(Clip.project_id == project.id, Clip.digest == digest)) \
        if DIGEST.match(digest) else None
    if clip is None:
        raise NotFound(f"clip {digest[:64]!r} not found in project {project.id}")
    return clip


def missing_clips(s: Session, project: Project, responses: list[str]) -> list[str]:
    """The clip references among `responses` that name no clip of `project`."""
    refs = {r for r in responses if is_clip(r)}
    digests = {r[len(PREFIX):] for r in refs}
    known = set(s.scalars(select(Clip.digest).where(Clip.project_id == project.id, Clip.digest.in_(digests)))) \
        if digests else set()
    return sorted(r for r in refs if r[len(PREFIX):] not in known)
