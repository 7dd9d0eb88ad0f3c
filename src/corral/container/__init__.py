"""The container tier's parts: engine detection (:mod:`.engine`), the pure envelope
builder (:mod:`.envelope`), the OCI seccomp profile (:mod:`.seccomp_oci`), the
host Python made visible inside an image (:mod:`.bundle`) and the first process
inside the container (:mod:`.boot`).  Nothing here is imported by the default
tier's hot path."""
