"""How a config section is declared: a class whose annotated attributes are its keys.

    class TrainSection(Section, path="train"):
        lr: float | int = key(1e-3, "peak learning rate", rule=positive("a positive number"))
        data: DataSection = part("the data section")

The annotation is the key's type (``float | int`` takes either, ``| None`` makes it nullable, ``dict`` is a
free-form mapping passed on as it is); ``key(...)`` gives the default, a one-line doc and the value's rules
(choices, minimum, maximum, any other single-key rule); ``part(doc)`` under a Section annotation is a nested
section.

A Section is a dict of its keys' values, so code that indexes ``cfg["train"]["lr"]``, json, ``**`` and
``isinstance(x, dict)`` all see plain data; the keys are descriptors, so ``cfg.train.lr`` reads and assigns the
same item. Every section holds every one of its keys, always: assignment checks the key's name and type,
removal is refused. Values are checked against the key's rules only by ``Config.check`` (``resolve`` calls it),
because a valid config may pass through invalid states while it is edited one key at a time.
"""

from __future__ import annotations

import copy
import inspect
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import yaml

from srforge.config.errors import ConfigError, unknown_key

NoneType = type(None)
TYPE_NAMES = {float: "float", int: "int", str: "str", bool: "bool", list: "list", dict: "mapping", NoneType: "null"}
# A rule beyond type, choices and minimum: called with (value, dotted path), raises ConfigError naming the path.
Rule = Callable[[Any, str], None]


def types_of(annotation: Any) -> tuple[type, ...]:
    """The classes an annotation admits, in its order: ``float | int | None`` -> (float, int, NoneType)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return tuple(t for arg in typing.get_args(annotation) for t in types_of(arg))
    if annotation is None:
        return (NoneType,)
    return (typing.get_origin(annotation) or annotation,)  # dict[str, Any] -> dict


def type_names(types_: tuple[type, ...]) -> str:
    return " or ".join(TYPE_NAMES.get(t, t.__name__) for t in types_)


def yaml11_float(value: Any, types_: tuple[type, ...]) -> Any:
    """``1e-3`` as a float: YAML 1.1 (PyYAML) reads exponents without a dot as strings."""
    if isinstance(value, str) and float in types_:
        try:
            return float(value)
        except ValueError:
            return value
    return value


class Key:
    """One config key: its types (from the annotation), default, one-line doc and the rules for its value.

    ``name`` is the key in YAML when it differs from the attribute (``class`` is a Python keyword: ``class_``).
    """

    def __init__(
        self, default: Any, doc: str, *, choices=None, minimum=None, maximum=None, rule: Rule | None = None, name=None
    ):
        self.default, self.doc, self.choices, self.rule = default, doc, choices, rule
        self.minimum, self.maximum = minimum, maximum
        self.name: str = name
        self.attr = ""
        self.types: tuple[type, ...] = ()

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr
        self.name = self.name or attr

    def __get__(self, section: Section | None, owner: type | None = None) -> Any:
        return self if section is None else section[self.name]

    def __set__(self, section: Section, value: Any) -> None:
        section[self.name] = value

    def __repr__(self) -> str:
        return f"Key({self.name}: {type_names(self.types)} = {self.default!r}; {self.doc})"

    @property
    def free_form(self) -> bool:
        """Whether the value may be a mapping (a Dataset's args, the augment recipe, train.self_training), whose
        entries an override may set one by one (srforge.config.overrides.set_free_form)."""
        return dict in self.types

    def new(self) -> Any:
        return copy.deepcopy(self.default)

    def accept(self, value: Any, path: str) -> Any:
        """``value`` (a copy) when it has one of the key's types; bool is an int in Python, but not here."""
        value = yaml11_float(value, self.types)
        if not isinstance(value, self.types) or (isinstance(value, bool) and bool not in self.types):
            raise ConfigError(f"{path}: expected {type_names(self.types)}, found {type(value).__name__} {value!r}.")
        return copy.deepcopy(value)

    def check(self, value: Any, path: str) -> None:
        """The key's own rules: choices, minimum and maximum (a null value, where null is allowed, has neither),
        ``rule``. Past the maximum the message quotes the key's doc, which says why the bound is there."""
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"{path}: expected one of {list(self.choices)}, found {value!r}.")
        if self.minimum is not None and value is not None and value < self.minimum:
            raise ConfigError(f"{path}: expected an integer >= {self.minimum}, found {value}.")
        if self.maximum is not None and value is not None and value > self.maximum:
            raise ConfigError(f"{path}: expected an integer <= {self.maximum} ({self.doc}), found {value}.")
        if self.rule is not None:
            self.rule(value, path)


class Part:
    """A nested section: the attribute's annotation names its Section class."""

    def __init__(self, doc: str):
        self.doc = doc
        self.name = self.attr = ""
        self.section: type[Section] = Section

    def __set_name__(self, owner: type, attr: str) -> None:
        self.name = self.attr = attr

    def __get__(self, section: Section | None, owner: type | None = None) -> Any:
        return self if section is None else section[self.name]

    def __set__(self, section: Section, value: Any) -> None:
        section[self.name] = value

    def new(self) -> Section:
        return self.section()

    def accept(self, value: Any, path: str) -> Section:
        """A copy of ``value`` when it is this section already, else the defaults with ``value`` merged in."""
        if isinstance(value, self.section):
            return copy.deepcopy(value)
        return self.section(value if value is not None else {})


def key(
    default: Any, doc: str, *, choices=None, minimum=None, maximum=None, rule: Rule | None = None, name=None
) -> Any:
    """A key of a Section (see :class:`Key`); typed ``Any`` so that ``lr: float = key(...)`` type-checks."""
    return Key(default, doc, choices=choices, minimum=minimum, maximum=maximum, rule=rule, name=name)


def part(doc: str) -> Any:
    """A nested section of a Section (see :class:`Part`)."""
    return Part(doc)


class Section(dict):
    """A config section: a dict of every one of its keys' values, with attribute access (see the module doc).

    ``Section(values)`` is the defaults with ``values`` (a mapping, e.g. from YAML) merged in and type-checked.
    """

    PATH: ClassVar[str] = ""  # the section's dotted path in the config, "" at the top
    FIELDS: ClassVar[dict[str, Key | Part]] = {}  # by YAML name, in declaration order

    def __init_subclass__(cls, path: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        hints = inspect.get_annotations(cls, eval_str=True)
        fields: dict[str, Key | Part] = {}
        for attr, field in vars(cls).items():
            if not isinstance(field, (Key, Part)):
                continue
            if attr not in hints:
                raise TypeError(f"{cls.__name__}.{attr}: a config key needs a type annotation.")
            if hasattr(Section, attr):
                raise TypeError(f"{cls.__name__}.{attr}: the name of a Section method; name the attribute otherwise.")
            if isinstance(field, Key):
                field.types = types_of(hints[attr])
            else:
                field.section = hints[attr]
            fields[field.name] = field
        cls.PATH, cls.FIELDS = path, fields

    def __init__(self, values: Mapping[str, Any] | None = None):
        super().__init__()
        for name, field in self.FIELDS.items():
            dict.__setitem__(self, name, field.new())
        if values is not None:
            self.merge(values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict.__repr__(self)})"

    def path_of(self, name: str) -> str:
        return f"{self.PATH}.{name}" if self.PATH else str(name)

    def field(self, name: Any) -> Key | Part:
        """The Key or Part called ``name`` here; an unknown name is a ConfigError naming the closest one."""
        try:
            return self.FIELDS[name]
        except (KeyError, TypeError):
            raise unknown_key(str(name), self.FIELDS, self.PATH) from None

    def merge(self, update: Any) -> None:
        """Merge ``update`` (a mapping, e.g. a YAML document) in: every key checked, nested sections merged,
        a null section read as empty."""
        if not isinstance(update, Mapping):
            raise ConfigError(f"{self.PATH or 'config'}: expected a mapping, found {type(update).__name__} {update!r}.")
        for name, value in update.items():
            if isinstance(self.field(name), Part):
                self[name].merge(value if value is not None else {})
            else:
                self[name] = value

    def to_dict(self) -> dict[str, Any]:
        """The plain nested dict (dicts, lists, strings, numbers, None) that YAML and checkpoints hold."""
        return {
            name: value.to_dict() if isinstance(value, Section) else copy.deepcopy(value)
            for name, value in self.items()
        }

    def walk(self) -> Iterator[tuple[str, Key, Any]]:
        """(dotted path, Key, value) of every key, nested sections' included, in declaration order."""
        for name, field in self.FIELDS.items():
            if isinstance(field, Part):
                yield from self[name].walk()
            else:
                yield self.path_of(name), field, self[name]

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The keys as plain data: {name: Key, or a nested dict for a section}, nested like the config."""
        return {name: f.section.schema() if isinstance(f, Part) else f for name, f in cls.FIELDS.items()}

    # -- every key stays present, and what is assigned is checked --------------------------------------------
    def __setitem__(self, name: str, value: Any) -> None:
        dict.__setitem__(self, name, self.field(name).accept(value, self.path_of(name)))

    def __setattr__(self, attr: str, value: Any) -> None:
        if not isinstance(getattr(type(self), attr, None), (Key, Part)):
            raise AttributeError(str(unknown_key(attr, (f.attr for f in self.FIELDS.values()), self.PATH)))
        object.__setattr__(self, attr, value)

    def __getattr__(self, attr: str) -> Any:  # only reached for a name that is no key
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise AttributeError(str(unknown_key(attr, (f.attr for f in self.FIELDS.values()), self.PATH)))

    def update(self, *args: Any, **kwargs: Any) -> None:
        for name, value in dict(*args, **kwargs).items():
            self[name] = value

    def setdefault(self, name: str, default: Any = None) -> Any:
        self.field(name)
        return self[name]

    def _refuse(self, *args: Any) -> Any:
        raise ConfigError(f"{self.PATH or 'config'}: a config key cannot be removed; set it to another value.")

    __delitem__ = pop = popitem = clear = _refuse


def _represent_section(dumper: yaml.SafeDumper, section: Section) -> yaml.Node:
    return dumper.represent_dict(section.to_dict())


# A config dumps as the plain mapping it reads from, also through yaml.safe_dump in users' own code.
yaml.SafeDumper.add_multi_representer(Section, _represent_section)
