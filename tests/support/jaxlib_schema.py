"""Message classes built from the descriptors that the installed jaxlib embeds.

XLA's real schemas, not ours: jaxlib's shared library keeps the serialized
``FileDescriptorProto`` of every proto file it was built with (``optionschema`` finds
``xla/xla.proto`` there the same way). Tests use them as an oracle for field numbers.
"""

from __future__ import annotations

import functools
import mmap

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from cachedoctor.xla import optionschema


def _embedded_file(library: mmap.mmap, name: str) -> descriptor_pb2.FileDescriptorProto:
    for candidate in optionschema.descriptor_candidates(library, name):
        try:
            proto = descriptor_pb2.FileDescriptorProto.FromString(candidate)
        except DecodeError:
            continue
        if proto.name == name:
            return proto
    raise AssertionError(f"the installed jaxlib embeds no descriptor of {name}")


@functools.cache
def _pool() -> descriptor_pool.DescriptorPool:
    return descriptor_pool.DescriptorPool()


@functools.cache
def _load(name: str) -> None:
    """Add one proto file of jaxlib's, and its imports first, to the pool."""
    libraries = optionschema.jaxlib_libraries()
    assert libraries, "jaxlib is installed with the package; its libraries must be found"
    with open(libraries[0], "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        proto = _embedded_file(mm, name)
    for dependency in proto.dependency:
        _load(dependency)
    _pool().Add(proto)


def message_class(proto_file: str, full_name: str) -> type[Message]:
    """The class of message ``full_name`` defined in jaxlib's ``proto_file``."""
    _load(proto_file)
    cls: type[Message] = message_factory.GetMessageClass(_pool().FindMessageTypeByName(full_name))
    return cls
