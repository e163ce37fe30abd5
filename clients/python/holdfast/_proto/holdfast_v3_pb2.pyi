from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RequestType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Ping: _ClassVar[RequestType]
    Lock: _ClassVar[RequestType]
    Unlock: _ClassVar[RequestType]
    Extend: _ClassVar[RequestType]
    Watch: _ClassVar[RequestType]
    Unwatch: _ClassVar[RequestType]
    Get: _ClassVar[RequestType]
    CheckFence: _ClassVar[RequestType]

class ResponseStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Ok: _ClassVar[ResponseStatus]
    General: _ClassVar[ResponseStatus]
    Version: _ClassVar[ResponseStatus]
    InvalidType: _ClassVar[ResponseStatus]
    TooManyKeys: _ClassVar[ResponseStatus]
    InvalidArgument: _ClassVar[ResponseStatus]
    AcquireTimeout: _ClassVar[ResponseStatus]
    NotHeld: _ClassVar[ResponseStatus]
    StaleFence: _ClassVar[ResponseStatus]

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Acquired: _ClassVar[EventKind]
    Released: _ClassVar[EventKind]
    Expired: _ClassVar[EventKind]
    Lost: _ClassVar[EventKind]
Ping: RequestType
Lock: RequestType
Unlock: RequestType
Extend: RequestType
Watch: RequestType
Unwatch: RequestType
Get: RequestType
CheckFence: RequestType
Ok: ResponseStatus
General: ResponseStatus
Version: ResponseStatus
InvalidType: ResponseStatus
TooManyKeys: ResponseStatus
InvalidArgument: ResponseStatus
AcquireTimeout: ResponseStatus
NotHeld: ResponseStatus
StaleFence: ResponseStatus
Acquired: EventKind
Released: EventKind
Expired: EventKind
Lost: EventKind

class Request(_message.Message):
    __slots__ = ("version", "id", "access_token", "type", "lock")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ACCESS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    version: int
    id: int
    access_token: str
    type: RequestType
    lock: RequestLock
    def __init__(self, version: _Optional[int] = ..., id: _Optional[int] = ..., access_token: _Optional[str] = ..., type: _Optional[_Union[RequestType, str]] = ..., lock: _Optional[_Union[RequestLock, _Mapping]] = ...) -> None: ...

class RequestLock(_message.Message):
    __slots__ = ("wait_micro", "release_micro", "keys", "shared", "limit", "value", "lock_delay_micro", "fence")
    WAIT_MICRO_FIELD_NUMBER: _ClassVar[int]
    RELEASE_MICRO_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_MICRO_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    wait_micro: int
    release_micro: int
    keys: _containers.RepeatedScalarFieldContainer[str]
    shared: bool
    limit: int
    value: bytes
    lock_delay_micro: int
    fence: int
    def __init__(self, wait_micro: _Optional[int] = ..., release_micro: _Optional[int] = ..., keys: _Optional[_Iterable[str]] = ..., shared: bool = ..., limit: _Optional[int] = ..., value: _Optional[bytes] = ..., lock_delay_micro: _Optional[int] = ..., fence: _Optional[int] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("version", "request_id", "status", "error_text", "keys", "server_unix_time", "fence", "info", "event")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_TEXT_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SERVER_UNIX_TIME_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    version: int
    request_id: int
    status: ResponseStatus
    error_text: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    server_unix_time: int
    fence: int
    info: _containers.RepeatedCompositeFieldContainer[KeyInfo]
    event: Event
    def __init__(self, version: _Optional[int] = ..., request_id: _Optional[int] = ..., status: _Optional[_Union[ResponseStatus, str]] = ..., error_text: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., server_unix_time: _Optional[int] = ..., fence: _Optional[int] = ..., info: _Optional[_Iterable[_Union[KeyInfo, _Mapping]]] = ..., event: _Optional[_Union[Event, _Mapping]] = ...) -> None: ...

class KeyInfo(_message.Message):
    __slots__ = ("key", "shared", "limit", "holders", "waiters", "delayed_micro")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    DELAYED_MICRO_FIELD_NUMBER: _ClassVar[int]
    key: str
    shared: bool
    limit: int
    holders: _containers.RepeatedCompositeFieldContainer[Holder]
    waiters: int
    delayed_micro: int
    def __init__(self, key: _Optional[str] = ..., shared: bool = ..., limit: _Optional[int] = ..., holders: _Optional[_Iterable[_Union[Holder, _Mapping]]] = ..., waiters: _Optional[int] = ..., delayed_micro: _Optional[int] = ...) -> None: ...

class Holder(_message.Message):
    __slots__ = ("fence", "value", "lease_left_micro", "node")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    LEASE_LEFT_MICRO_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    fence: int
    value: bytes
    lease_left_micro: int
    node: int
    def __init__(self, fence: _Optional[int] = ..., value: _Optional[bytes] = ..., lease_left_micro: _Optional[int] = ..., node: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("key", "kind", "fence", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    kind: EventKind
    fence: int
    value: bytes
    def __init__(self, key: _Optional[str] = ..., kind: _Optional[_Union[EventKind, str]] = ..., fence: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...
