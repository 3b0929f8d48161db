"""One query model per read and forget operation: the rules of their arguments, once.

``Memory.search``, ``get_memory``, ``forget`` and the listings build these models from their
keyword arguments; the server takes the same models as request bodies (less the user or the
session that the route's path names); the client builds them and sends their JSON. A rule is
written here once, with the words every face reports (``limit: expected an integer from 1 to
1000 (got 0)``), and a request is checked by it whichever face it came through.

Values are taken as they are, not coerced: ``limit=True`` or ``"5"`` is no integer and
``details="yes"`` no boolean, from Python and over JSON alike. Times are the exception,
read by ``Timestamp`` as everywhere (ISO-8601 or epoch seconds).
"""

# No `from __future__ import annotations`: pydantic would compile every annotation string
# at import, a third of this module's import time.
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, TypeVar, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from ._checks import ID_RULE, MAX_LIMIT, MAX_OFFSET, int_problem, is_id, text_rule_problem
from ._strings import UNICODE_RULE, shown, value_problem
from ._time import Timestamp
from ._vocabulary import FactStatus, MessageStatus, SummaryStatus
from .errors import ValidationError
from .types import ID_PATTERN, ROLES, RecallConfig, Role, SearchLayer

__all__ = [
    "FACT_STATUSES",
    "MAX_EXCLUDE_TEXTS",
    "MESSAGE_STATUSES",
    "SEARCH_LAYERS",
    "SUMMARY_STATUSES",
    "ContextQuery",
    "ContextRequest",
    "FactQuery",
    "ForgetScope",
    "ItemQuery",
    "ListQuery",
    "MessageQuery",
    "Query",
    "SearchQuery",
    "SearchRequest",
    "SummaryQuery",
    "arguments",
    "field_path",
    "problems",
]

Q = TypeVar("Q", bound="Query")

SEARCH_LAYERS: tuple[str, ...] = get_args(SearchLayer)
FACT_STATUSES: tuple[str, ...] = get_args(FactStatus)
SUMMARY_STATUSES: tuple[str, ...] = get_args(SummaryStatus)
MESSAGE_STATUSES: tuple[str, ...] = get_args(MessageStatus)
REASON_MAX = 2000
MAX_FORGET_IDS = 10_000
# get_memory's exclude_texts: the turns of one prompt (each at most max_content_chars).
MAX_EXCLUDE_TEXTS = 1000
# GUMem's docs put the metadata filters inside the recall config; they are taken out of it.
_METADATA_KEYS = ("MetadataFilters", "metadata_filters")

Wrap = Callable[[Any, ValidatorFunctionWrapHandler], Any]


# -- the rules, as pydantic types ---------------------------------------------------------
#
# Each is a WrapValidator that decides for itself (with the message of its rule) instead of
# pydantic's lax conversion; the type under it still gives the OpenAPI schema.


def _rule(kind: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(kind, "{rule}", {"rule": message})


def _id(value: Any, handler: ValidatorFunctionWrapHandler) -> str:
    if not is_id(value):
        raise _rule("id", ID_RULE)
    return str(value)


def _integer(low: int, high: int | None) -> Wrap:
    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> int:
        problem = int_problem(value, low, high)
        if problem is not None:
            raise _rule("integer", problem)
        return int(value)

    return check


def _flag(value: Any, handler: ValidatorFunctionWrapHandler) -> bool:
    if not isinstance(value, bool):
        raise _rule("flag", "expected true or false")
    return value


def _one_of(choices: tuple[str, ...]) -> Wrap:
    message = f"expected one of {', '.join(choices)}"

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> str:
        if not isinstance(value, str) or value not in choices:
            raise _rule("choice", message)
        return value

    return check


def _many(message: str, low: int = 0, high: int | None = None) -> Wrap:
    """A list (or tuple, set ...) of ``low`` to ``high`` items; a string is not one."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> list[Any]:
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
            raise _rule("list", message)
        items = list(value)
        if len(items) < low or (high is not None and len(items) > high):
            raise _rule("list", message)
        checked: list[Any] = handler(items)  # each item by its own rule, named by its index
        return checked

    return check


def _text(message: str, *, blank: bool) -> Callable[..., str]:
    def check(value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> str:
        if not isinstance(value, str) or (not blank and not value.strip()):
            raise _rule("text", message)
        # The engine's configured limit (max_content_chars), given by Query.build; the
        # server's body validation has none, and the engine it calls applies it.
        most = (info.context or {}).get("max_chars")
        if most is not None and len(value) > most:
            raise _rule("text", f"too long: {len(value)} characters; the limit is {most}")
        return value

    return check


def _short_text(low: int, high: int) -> Wrap:
    message = f"expected a string of {low} to {high} characters"

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> str:
        if not isinstance(value, str) or not low <= len(value) <= high:
            raise _rule("text", message)
        return value

    return check


def _reason(value: Any, handler: ValidatorFunctionWrapHandler) -> str:
    problem = text_rule_problem(value, REASON_MAX)
    if problem is not None:
        raise _rule("text", problem)
    return str(value)


def _when(value: Any, handler: ValidatorFunctionWrapHandler) -> datetime:
    try:
        return handler(value)  # type: ignore[no-any-return]
    except PydanticValidationError as exc:
        error = exc.errors()[0]
        if error["type"] == "value_error":  # out of range, a boolean: the reason says which
            raise _rule("datetime", str(error["ctx"]["error"])) from None
        raise _rule("datetime", "expected an ISO-8601 datetime or epoch seconds") from None


def _object(value: Any, handler: ValidatorFunctionWrapHandler) -> dict[str, Any]:
    # Metadata filters: their grammar is the store's (parse_metadata_filters), checked when
    # the engine translates them; here only that they are an object of storable strings.
    if not isinstance(value, dict):
        raise _rule("object", "expected an object")
    return value


def _config(value: Any) -> RecallConfig:
    if isinstance(value, RecallConfig):
        return value
    if not isinstance(value, dict):
        raise _rule("object", "expected an object")
    return RecallConfig.model_validate(value)  # its errors at their keys, under this field


Id = Annotated[str, Field(pattern=ID_PATTERN), WrapValidator(_id)]
Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT), WrapValidator(_integer(1, MAX_LIMIT))]
Offset = Annotated[int, Field(ge=0, le=MAX_OFFSET), WrapValidator(_integer(0, MAX_OFFSET))]
Flag = Annotated[bool, WrapValidator(_flag)]
When = Annotated[Timestamp, WrapValidator(_when)]
JsonObject = Annotated[dict[str, Any], WrapValidator(_object)]
if TYPE_CHECKING:
    Config = RecallConfig
else:
    # A free object in the OpenAPI document (GUMem's PascalCase keys and MetadataFilters are
    # welcome too), typed Any here so that FastAPI does not list RecallConfig's schema.
    Config = Annotated[
        Any,
        PlainValidator(_config),
        WithJsonSchema({"type": "object", "additionalProperties": True}),
    ]
Reason = Annotated[
    str,
    Field(min_length=1, max_length=REASON_MAX, description="Why (audited)."),
    WrapValidator(_reason),
]
_FORGET_IDS = _many(f"expected a list of 1 to {MAX_FORGET_IDS} ids", 1, MAX_FORGET_IDS)
EventType = Annotated[str, Field(min_length=1, max_length=64), WrapValidator(_short_text(1, 64))]
# Each text at most max_content_chars, as the query (the engine's limit, given by Query.build).
ExcludeTexts = Annotated[
    tuple[Annotated[str, WrapValidator(_text("expected a string", blank=True))], ...],
    Field(max_length=MAX_EXCLUDE_TEXTS),
    WrapValidator(
        _many(f"expected a list of at most {MAX_EXCLUDE_TEXTS} strings", 0, MAX_EXCLUDE_TEXTS)
    ),
]


# -- errors -------------------------------------------------------------------------------

# Errors whose input is not worth quoting: absent, or named by the message itself.
_UNQUOTED = frozenset({"missing", "extra_forbidden", "unstorable", "scope"})
_MESSAGES = {
    "extra_forbidden": "unknown field",
    "string_unicode": UNICODE_RULE,  # pydantic-core's own refusal of a lone surrogate
}
_INDEX = re.compile(r"\[(\d+)\]")


def field_path(loc: Iterable[int | str]) -> str:
    """``("messages", 2, "role")`` as ``messages[2].role``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def problems(exc: PydanticValidationError) -> list[str]:
    """One line per error: ``"field: what is wrong (got <the value>)"``."""
    lines = []
    for err in exc.errors():
        kind = err["type"]
        message = _MESSAGES.get(kind, err["msg"])
        if kind not in _UNQUOTED:
            message += f" (got {shown(err.get('input'))})"
        field = field_path(err["loc"])
        lines.append(f"{field}: {message}" if field else message)
    return lines


def _located(title: str, found: list[tuple[tuple[int | str, ...], str, str, Any]]) -> Exception:
    """Errors at places inside the value being validated (pydantic prefixes the field)."""
    return PydanticValidationError.from_exception_data(
        title,
        [
            InitErrorDetails(type=_rule(kind, message), loc=loc, input=given)
            for loc, kind, message, given in found
        ],
    )


def _path(path: str) -> tuple[int | str, ...]:
    # value_problem's "[2].address.city" as loc parts that field_path joins back into the
    # same text: the leading list indexes, then the rest as one part (a key may hold dots).
    parts: list[int | str] = []
    while (index := _INDEX.match(path)) is not None:
        parts.append(int(index.group(1)))
        path = path[index.end() :]
    rest = path.removeprefix(".")
    return (*parts, rest) if rest else tuple(parts)


def arguments(frame: Mapping[str, Any]) -> dict[str, Any]:
    """A method's arguments from its ``locals()`` (first thing in its body), ``self`` left
    out: a face hands its keyword signature to a query model whole, so each parameter is
    named in the signature and in the model, not again in a call between them."""
    return {k: v for k, v in frame.items() if k != "self"}


# -- the models ---------------------------------------------------------------------------


class Query(BaseModel):
    """Base of the query models: unknown fields are refused (a misspelt option is an error,
    not silently ignored) and every string, at any depth, must be one the stores can hold
    (see _strings), refused at its own place (``filters.address.city``)."""

    # Not defer_build: a first use from several threads at once (the server's) could
    # validate with a base class's validator on the pydantic versions this package allows.
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        found = value_problem(value)
        if found is not None:
            raise _located(cls.__name__, [(_path(found[0]), "unstorable", found[1], value)])
        return value

    @classmethod
    def build(
        cls: type[Q],
        fields: Mapping[str, Any],
        *,
        what: str,
        max_chars: int | None = None,
        error: type[ValidationError] = ValidationError,
    ) -> Q:
        """The query for ``fields``, or ``error("invalid <what>", one line per problem)``.
        ``max_chars`` bounds the query text (the engine's ``max_content_chars``)."""
        try:
            return cls.model_validate(
                fields, context=None if max_chars is None else {"max_chars": max_chars}
            )
        except PydanticValidationError as exc:
            raise error(f"invalid {what}", problems(exc)) from None

    def arguments(self) -> dict[str, Any]:
        """The fields as keyword arguments of the method the model describes."""
        return dict(self)


class SearchRequest(Query):
    """A search of the memory of the user the route names: what ``Memory.search`` takes
    but the user."""

    query: Annotated[
        str, Field(min_length=1), WrapValidator(_text("expected a non-empty string", blank=False))
    ]
    limit: Annotated[int, Field(ge=1, le=1000), WrapValidator(_integer(1, 1000))] = 10
    filters: JsonObject | None = Field(default=None, description="Metadata filters.")
    session_id: Id | None = None
    since: When | None = None
    until: When | None = None
    roles: (
        Annotated[
            list[Annotated[Role, WrapValidator(_one_of(ROLES))]],
            WrapValidator(_many(f"expected a list of {', '.join(ROLES)}")),
        ]
        | None
    ) = None
    event_types: (
        Annotated[
            list[EventType],
            WrapValidator(_many("expected a list of strings of 1 to 64 characters")),
        ]
        | None
    ) = None
    as_of: When | None = None
    layers: (
        Annotated[
            list[Annotated[SearchLayer, WrapValidator(_one_of(SEARCH_LAYERS))]],
            Field(min_length=1),
            WrapValidator(_many(f"expected a non-empty list of {', '.join(SEARCH_LAYERS)}", 1)),
        ]
        | None
    ) = None
    include_superseded: Flag | None = None
    recall_config: Config | None = None


class SearchQuery(SearchRequest):
    """Everything ``Memory.search`` takes."""

    user_id: Id


class _Recall(Query):
    query: Annotated[str, WrapValidator(_text("expected a string", blank=True))] | None = Field(
        default=None, description="What the next model call is about."
    )
    recall_config: Config | None = Field(
        default=None,
        description="GUM's snake_case keys or GUMem's PascalCase ones (`MessageRecentLimit`); "
        "a `MetadataFilters` key inside it is taken as `metadata_filters`.",
    )
    metadata_filters: JsonObject | None = Field(
        default=None, description='Metadata filters, e.g. `{"channel": "web"}`.'
    )
    exclude_texts: ExcludeTexts = Field(
        default=(),
        description="Texts the prompt already carries, e.g. the request's own turns: a message "
        "whose content equals one of them (leading and trailing whitespace aside) is left out "
        "of the matches, the quotes under summaries and facts and the `history`; the slot of a "
        f"match left out goes to the next memory. At most {MAX_EXCLUDE_TEXTS}.",
    )

    @model_validator(mode="before")
    @classmethod
    def _gumem_filters(cls, data: Any) -> Any:
        config = data.get("recall_config") if isinstance(data, dict) else None
        if not isinstance(config, dict) or not any(k in config for k in _METADATA_KEYS):
            return data
        config, filters = dict(config), {}
        found: list[tuple[tuple[int | str, ...], str, str, Any]] = []
        for key in _METADATA_KEYS:
            if key not in config:
                continue
            inner = config.pop(key)
            if not isinstance(inner, dict):
                found.append((("recall_config", key), "object", "expected an object", inner))
            elif (bad := value_problem(inner)) is not None:
                where = ("recall_config", key, *_path(bad[0]))
                found.append((where, "unstorable", bad[1], inner))
            else:
                filters.update(inner)
        if found:
            raise _located(cls.__name__, found)
        given = data.get("metadata_filters")
        if isinstance(given, dict):
            filters.update(given)  # the explicit filters win over the config's
        elif given is not None:
            return {**data, "recall_config": config}  # refused as it is, by its own rule
        return {**data, "recall_config": config or None, "metadata_filters": filters or None}


class ContextRequest(_Recall):
    """A recall for the next model call in the session the route names. ``query`` and
    ``details`` may come in the query string instead, as GUMem's SDK sends them; given in
    the body, they win."""

    details: Flag | None = Field(
        default=None, description="Also return the matched items of every layer with scores."
    )


class ContextQuery(_Recall):
    """Everything ``Memory.get_memory`` takes."""

    session_id: Id
    details: Flag = False


class ForgetScope(Query):
    """Forget by exactly one scope: messages, a session, or a topic of the user."""

    user_id: Id
    message_ids: (
        Annotated[
            list[Id],
            Field(min_length=1, max_length=MAX_FORGET_IDS),
            WrapValidator(_FORGET_IDS),
        ]
        | None
    ) = None
    session_id: Id | None = None
    topic_id: Id | None = None
    reason: Reason | None = None

    @model_validator(mode="after")
    def _one_scope(self) -> "ForgetScope":
        names = ("message_ids", "session_id", "topic_id")
        given = [n for n in names if getattr(self, n) is not None]
        if len(given) != 1:
            told = f"{len(given)} given: {', '.join(given)}" if given else "none given"
            message = f"give exactly one of {', '.join(names)} ({told})"
            raise _located(type(self).__name__, [((n,), "scope", message, None) for n in names])
        return self


class ListQuery(Query):
    """A page of a listing: whose (``user_id``, every user if None) and which page."""

    user_id: Id | None = None
    limit: Limit = 100
    offset: Offset = 0


class MessageQuery(ListQuery):
    """``mem.messages.list``: one user's or one session's messages."""

    session_id: Id | None = None
    status: Annotated[MessageStatus, WrapValidator(_one_of(MESSAGE_STATUSES))] | None = None


class ItemQuery(ListQuery):
    """A listing of facts or summaries: statuses (one or several; each kind has its own),
    a time window and metadata filters on the source messages."""

    STATUSES: ClassVar[tuple[str, ...]] = ()

    status: tuple[str, ...] = ()
    since: When | None = None
    until: When | None = None
    metadata_filters: JsonObject | None = None

    @field_validator("status", mode="plain")
    @classmethod
    def _known(cls, value: Any) -> tuple[str, ...]:
        wanted = () if value is None else (value,) if isinstance(value, str) else value
        if (
            isinstance(wanted, (bytes, Mapping))
            or not isinstance(wanted, Iterable)
            or not all(isinstance(s, str) and s in cls.STATUSES for s in wanted)
        ):
            raise _rule("choice", f"expected one or more of {', '.join(cls.STATUSES)}")
        return tuple(wanted)


class FactQuery(ItemQuery):
    """``mem.facts.list``."""

    STATUSES = FACT_STATUSES


class SummaryQuery(ItemQuery):
    """``mem.summaries.list``."""

    STATUSES = SUMMARY_STATUSES
