"""Headers for responses that carry a tenant's bytes."""

from __future__ import annotations

# Sent with every response of a tenant's bytes on this origin (the signed blob route, the HF
# door's resolve/, the OCI door's blobs, version file downloads): the UI lives on the same
# origin, so a tenant's payload.js must never run as script (`nosniff` with a non-script type),
# render as a page (`attachment`), or act as a document if opened (a sandboxing CSP).
TENANT_BYTES_HEADERS = {
    "x-content-type-options": "nosniff",
    "content-disposition": "attachment",
    "content-security-policy": "default-src 'none'; sandbox",
}
