"""The one compiled part of voicegate: the C media port (telephony/media_port.c), with the evidence
detector it runs on caller frames (telephony/evidence_vad.c).

It is a plain shared library loaded with ctypes (no Python C API), built as an optional
extension: where no C compiler is found the install still succeeds and voicegate runs its Python
media port instead (telephony/c_media_port.py says which one it uses, and why).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "telephony._media_port",
            sources=["telephony/media_port.c", "telephony/evidence_vad.c"],
            depends=["telephony/evidence_vad.h"],
            # No fused multiply-adds: the detector must round as Python does (evidence_vad.c).
            extra_compile_args=[
                "-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-ffp-contract=off"
            ],
            libraries=["m"],
            optional=True,
        )
    ]
)
