"""The native front of kernel-served mounts (shardfs/fuse/kernel_served/_front.c), built
with the package. Optional: where it cannot be built, shardfs mounts without it, and the
mount's log says so (docs/design.md, "The native front")."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "shardfs.fuse.kernel_served._front",
            ["shardfs/fuse/kernel_served/_front.c"],
            extra_compile_args=["-O2", "-Wall", "-Wno-missing-field-initializers"],
            optional=True,
        )
    ]
)
