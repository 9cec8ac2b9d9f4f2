"""The OCI distribution door (read side): ``/v2/`` serves sources and tensorized variants as
CNCF ModelPack artifacts, so oras, skopeo, containerd/Docker, KitOps and KServe pull from the
registry as from any container registry (docs/front-doors.md, "OCI distribution")."""
