"""The canonical blob path check (issue 33 §1): the path a signature is checked against is the
path as sent, and anything a proxy, cache or file system could read as another path is refused
(403 ``path_not_canonical``) before any signature is looked at."""

from __future__ import annotations

import pytest

from tensor_registry_server.blobs.service import canonical_blob_path
from tensor_registry_server.core.errors import AppError

A = "artifacts/3f1c2a9e-0000-4000-8000-000000000001"
B = "artifacts/3f1c2a9e-0000-4000-8000-000000000002"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (f"/api/v1/blobs/local/{A}/model.tensors", ("local", f"{A}/model.tensors")),
        (f"/api/v1/blobs/s3/{A}/model-rank-001.tensors", ("s3", f"{A}/model-rank-001.tensors")),
        (f"/api/v1/blobs/local/{A}/sub/dir/config.json", ("local", f"{A}/sub/dir/config.json")),
        # Short paths are the signature check's to refuse (signature_invalid), not this one's.
        ("/api/v1/blobs/local/model.tensors", ("local", "model.tensors")),
    ],
)
def test_a_canonical_path_is_taken_as_it_is(path: str, expected: tuple[str, str]) -> None:
    assert canonical_blob_path(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        f"/api/v1/blobs/local/{A}/../{B[10:]}/model.tensors",
        f"/api/v1/blobs/local/{A}/%2e%2e/{B[10:]}/model.tensors",
        f"/api/v1/blobs/local/{A}/%2E%2E/{B[10:]}/model.tensors",
        f"/api/v1/blobs/local/{A}/..%2f{B[10:]}/model.tensors",
        f"/api/v1/blobs/local/{A}%2f..%2f{B[10:]}/model.tensors",
        f"/api/v1/blobs/local/{A}/./../{B[10:]}/model.tensors",
        f"/api/v1/blobs/local/{A}//../../{B}/model.tensors",
        f"/api/v1/blobs/local/{A}/../../../../../etc/passwd",
        f"/api/v1/blobs/local/{A}/./model.tensors",
        f"/api/v1/blobs/local/{A}//model.tensors",
        f"/api/v1/blobs/local/{A}/model.tensors/",
        f"/api/v1/blobs/local/{A}/model%2etensors",
        f"/api/v1/blobs/local/{A}/model%41.tensors",
        f"/api/v1/blobs/local/{A}/model.tensors%00",
        f"/api/v1/blobs/local/{A}\\..\\x/model.tensors",
        f"/api/v1/blobs//local/{A}/model.tensors",
        f"/api/v1/blobs/local/{A}/model.tensors#x",
        "/api/v1/blobs/local",
        "/api/v1/blobs/",
        f"/api/v1/models/../blobs/local/{A}/model.tensors",
    ],
)
def test_a_non_canonical_path_is_refused_before_its_signature(path: str) -> None:
    with pytest.raises(AppError) as refused:
        canonical_blob_path(path)
    assert (refused.value.status, refused.value.code) == (403, "path_not_canonical")
