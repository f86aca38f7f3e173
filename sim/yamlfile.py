"""Reading a YAML input file within stated bounds, refusing what a plain ``yaml.safe_load`` accepts silently.

- only a regular file of at most ``MAX_FILE_BYTES`` is read (not /dev/zero, a FIFO or a huge file);
- a key given twice in one mapping is an error naming its line (YAML says keys are unique; PyYAML
  silently keeps the last one);
- at most ``MAX_ALIASES`` aliases, and a document that would expand to more than ``MAX_NODES`` nodes
  (an alias bomb: a few lines that expand to billions of values) is refused before it is built.

Every problem is a KvsimError naming the file (and line when known).
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from sim.errors import KvsimError

MAX_FILE_BYTES = 1 << 20   # 1 MiB: a scenario or sweep file (traces are separate files)
MAX_ALIASES = 100
MAX_NODES = 200_000        # scalars, sequences and mappings after expanding aliases


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that counts aliases and refuses duplicate mapping keys."""

    aliases = 0

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"__kvsim__:{mark.line + 1}:more than {MAX_ALIASES} aliases")
        return super().compose_node(parent, index)


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes the document has once every alias is expanded (aliases share node objects; memoized)."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = MAX_NODES + 1  # a recursive alias counts as too big
    if isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(v, memo) for v in node.value)
    else:
        size = 1
    memo[key] = min(size, MAX_NODES + 1)
    return memo[key]


def _first_duplicate(node: yaml.Node) -> tuple[str, int] | None:
    """(key, line) of the first key repeated inside one mapping, anywhere in the document."""
    seen_nodes: set[int] = set()
    stack = [node]
    while stack:
        cur = stack.pop()
        if id(cur) in seen_nodes:
            continue
        seen_nodes.add(id(cur))
        if isinstance(cur, yaml.MappingNode):
            keys: set[str] = set()
            for k, v in cur.value:
                if isinstance(k, yaml.ScalarNode):
                    if k.value in keys and k.tag != "tag:yaml.org,2002:merge":
                        return k.value, k.start_mark.line + 1
                    keys.add(k.value)
                stack.extend((k, v))
        elif isinstance(cur, yaml.SequenceNode):
            stack.extend(cur.value)
    return None


def parse_yaml(text: str, source: str) -> tuple[Any, yaml.Node | None]:
    """(data, composed node) of one YAML document, or a KvsimError naming ``source`` and the line."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        if _expanded_size(node, {}) > MAX_NODES:
            raise KvsimError(source, f"the YAML expands to more than {MAX_NODES:,} values (an alias bomb?)")
        dup = _first_duplicate(node)
        if dup is not None:
            raise KvsimError(f"{source}:{dup[1]}", f"{dup[0]}: key given twice in one mapping")
        data = loader.construct_document(node)
    except yaml.YAMLError as e:
        text_e = str(e)
        if text_e.startswith("__kvsim__:"):
            _, line, what = text_e.split(":", 2)
            raise KvsimError(f"{source}:{line}", f"invalid YAML: {what}") from None
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise KvsimError(where, f"invalid YAML: {getattr(e, 'problem', None) or e}") from None
    except RecursionError:
        raise KvsimError(source, "invalid YAML: nested too deeply") from None
    finally:
        loader.dispose()
    return data, node


def read_text_bounded(path: Path, what: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The text of a regular file of at most ``max_bytes``; a KvsimError otherwise, before reading."""
    source = str(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise KvsimError(source, "no such file") from None
    except OSError as e:
        raise KvsimError(source, f"cannot read: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise KvsimError(source, f"is a directory, not a {what}")
    if not stat.S_ISREG(st.st_mode):
        raise KvsimError(source, f"not a regular file (a device, pipe or socket), not a {what}")
    if st.st_size > max_bytes:
        raise KvsimError(source, f"{st.st_size:,} bytes; a {what} may be at most {max_bytes:,} bytes")
    try:
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise KvsimError(source, f"a {what} may be at most {max_bytes:,} bytes")
        return raw.decode("utf-8-sig")   # (a leading byte-order mark, as some editors write, is dropped)
    except (OSError, UnicodeDecodeError) as e:
        raise KvsimError(source, f"cannot read: {e}") from None


def read_yaml_file(path: Path, what: str) -> tuple[str, Any, yaml.Node | None]:
    """(text, data, node) of a bounded YAML file (see the module docstring)."""
    text = read_text_bounded(path, what)
    data, node = parse_yaml(text, str(path))
    return text, data, node
