# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark workloads: the guide's two built-in ones and user prompt files (JSONL).

A workload is a fixed list of prompts in a fixed order; both sides of an A/B get exactly the same list.
Each prompt is ``{"id": str, "messages": [...], "prompt": str}``: the chat API sends ``messages``, the
completions API sends ``prompt`` (the same text). A plain prompt becomes one user message whose content is a
list with one text part, ``[{"type": "text", "text": prompt}]``: the exact request shape ``vllm bench serve
--backend openai-chat`` sends, so both tools put the same requests to the server.

JSONL files: one JSON value per line, blank lines and lines starting with ``#`` ignored. A line is either
a string (the prompt), or an object with ``prompt`` (string) or ``messages`` (a list of
``{"role", "content"}``), an optional ``id`` and an optional ``class``. This is also the shape ``vllm bench serve
--dataset-name custom`` reads (``{"prompt": ...}``, other keys ignored), so one file can drive both tools.

``class`` names the request class a prompt belongs to (``code``, ``chat``, ``summarize``...): the reports give figures
and a decision per class, and the routing plan (bench/routing_plan.py) sends each class to the pool that serves it
best. It is a DNS label (lowercase letters, digits, ``-``, at most 63 characters) because it becomes an HTTP header
value the clients set and part of an HTTPRoute rule's name. A prompt without one is unclassified.
"""

from __future__ import annotations

import json
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

# A realistic 30-line class without docstrings or type hints, as the guide's code-refactor workload asks.
_INVENTORY_CLASS = '''class InventoryLedger:
    def __init__(self, warehouse, low_stock_threshold=5):
        self.warehouse = warehouse
        self.low_stock_threshold = low_stock_threshold
        self._items = {}
        self._history = []

    def receive(self, sku, quantity, unit_cost):
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        item = self._items.setdefault(sku, {"quantity": 0, "cost": 0.0})
        total_cost = item["cost"] * item["quantity"] + unit_cost * quantity
        item["quantity"] += quantity
        item["cost"] = total_cost / item["quantity"]
        self._history.append(("receive", sku, quantity))

    def ship(self, sku, quantity):
        item = self._items.get(sku)
        if item is None or item["quantity"] < quantity:
            raise KeyError("not enough stock for %s" % sku)
        item["quantity"] -= quantity
        self._history.append(("ship", sku, quantity))
        return quantity * item["cost"]

    def low_stock(self):
        return sorted(sku for sku, item in self._items.items()
                      if item["quantity"] < self.low_stock_threshold)

    def valuation(self):
        return round(sum(i["quantity"] * i["cost"] for i in self._items.values()), 2)

    def history_for(self, sku):
        return [entry for entry in self._history if entry[1] == sku]
'''

_RATE_LIMITER_CLASS = '''import time


class SlidingWindowRateLimiter:
    def __init__(self, limit, window_seconds, clock=time.monotonic):
        self.limit = limit
        self.window_seconds = window_seconds
        self.clock = clock
        self._events = {}

    def _prune(self, key, now):
        events = self._events.get(key, [])
        cutoff = now - self.window_seconds
        while events and events[0] <= cutoff:
            events.pop(0)
        self._events[key] = events
        return events

    def allow(self, key):
        now = self.clock()
        events = self._prune(key, now)
        if len(events) >= self.limit:
            return False
        events.append(now)
        return True

    def remaining(self, key):
        return max(0, self.limit - len(self._prune(key, self.clock())))

    def retry_after(self, key):
        events = self._prune(key, self.clock())
        if len(events) < self.limit:
            return 0.0
        return max(0.0, events[0] + self.window_seconds - self.clock())
'''

_REFACTOR_INSTRUCTION = (
    "Refactor the following Python class: add a docstring to the class and to every method, and add "
    "complete type hints to every parameter and return value. Do not change the behaviour. Return the "
    "whole class, complete, in one Python code block, and nothing else.\n\n```python\n%s```\n"
)

_CHAT_TOPICS = (
    "how public-key cryptography lets two strangers agree on a secret over an open network",
    "how a database index speeds up queries, and what it costs on writes",
    "why speculative execution makes modern processors faster, and what can go wrong with it",
)

_CHAT_INSTRUCTION = (
    "Explain %s. Write for a curious engineer who is new to the subject: start from the basic idea, build "
    "up with a concrete example, cover the common misconceptions and the practical trade-offs, and end with "
    "a short summary. Your answer must be at least 800 words long."
)

WORKLOADS = ("code_refactor", "general_chat")
# The request class of each built-in workload's prompts: the guide's table has a code refactor at 1.84x and chat at 0.99x.
WORKLOAD_CLASSES = {"code_refactor": "code", "general_chat": "chat"}

# A DNS-1123 label (Kubernetes' IsDNS1123Label): safe as a header value, a Service-free route name part and a JSON key.
CLASS_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
CLASS_MAX_LEN = 63


def _prompt(prompt_id, text, request_class):
    return {"id": prompt_id, "prompt": text, "messages": user_message(text), "class": request_class}


def check_class(value, where, field="prompts_file"):
    """``value`` if it is a valid request class (see the module docstring), else a ValidationError naming ``where``."""
    if isinstance(value, str) and len(value) <= CLASS_MAX_LEN and CLASS_RE.match(value):
        return value
    raise ValidationError("%s: class %s is not a request class name" % (where, json.dumps(value)), field=field,
                          hint='give a lowercase DNS label (letters a-z, digits, "-", at most 63 characters), '
                               'e.g. "class": "code", or leave "class" out for an unclassified prompt')


def user_message(text):
    """One user message with one text part (what ``vllm bench serve`` sends for a plain prompt)."""
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


def builtin_workload(name):
    """The prompts of a built-in workload, in their fixed order."""
    if name == "code_refactor":
        return [
            _prompt("code_refactor/inventory_ledger", _REFACTOR_INSTRUCTION % _INVENTORY_CLASS, WORKLOAD_CLASSES[name]),
            _prompt("code_refactor/rate_limiter", _REFACTOR_INSTRUCTION % _RATE_LIMITER_CLASS, WORKLOAD_CLASSES[name]),
        ]
    if name == "general_chat":
        return [_prompt("general_chat/%d" % i, _CHAT_INSTRUCTION % topic, WORKLOAD_CLASSES[name]) for i, topic in enumerate(_CHAT_TOPICS)]
    raise ValidationError("unknown workload %r" % (name,), field="workload",
                          hint="use one of %s, or give prompts_file" % ", ".join(WORKLOADS))


def parse_prompts_jsonl(text, source="prompts_file"):
    """Parse JSONL prompt text (see the module docstring) into the prompt list, keeping the file order."""
    prompts = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = "%s line %d" % (source, lineno)
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise ValidationError("%s is not valid JSON (%s)" % (where, exc), field="prompts_file",
                                  hint='write one JSON object per line, e.g. {"prompt": "..."}')
        prompt_id = "%s:%d" % (source, lineno)
        request_class = None
        if isinstance(value, dict) and value.get("class") is not None:
            request_class = check_class(value["class"], where)
        if isinstance(value, str):
            text_value = value
            messages = user_message(value)
        elif isinstance(value, dict):
            prompt_id = str(value.get("id", prompt_id))
            if "messages" in value:
                messages = value["messages"]
                if (not isinstance(messages, list) or not messages
                        or not all(isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in messages)):
                    raise ValidationError("%s: messages must be a non-empty list of {role, content} objects" % where,
                                          field="prompts_file", hint='e.g. {"messages": [{"role": "user", "content": "..."}]}')
                text_value = value.get("prompt") if isinstance(value.get("prompt"), str) else "\n\n".join(m["content"] for m in messages)
            elif isinstance(value.get("prompt"), str):
                text_value = value["prompt"]
                messages = user_message(text_value)
            else:
                raise ValidationError("%s has neither a string 'prompt' nor 'messages'" % where, field="prompts_file",
                                      hint='write {"prompt": "..."} or {"messages": [...]} on each line')
        else:
            raise ValidationError("%s must be a JSON string or object, got %s" % (where, type(value).__name__),
                                  field="prompts_file", hint='write {"prompt": "..."} on each line')
        if not text_value.strip():
            raise ValidationError("%s has an empty prompt" % where, field="prompts_file", hint="remove the line or give it text")
        prompt = {"id": prompt_id, "prompt": text_value, "messages": messages}
        if request_class is not None:
            prompt["class"] = request_class
        prompts.append(prompt)
    if not prompts:
        raise ValidationError("%s holds no prompts" % source, field="prompts_file", hint="add at least one JSONL line")
    return prompts


def load_prompts_file(path):
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ValidationError("cannot read %s (%s)" % (path, exc.strerror or exc), field="prompts_file",
                              hint="give the path of a readable JSONL file on the host that runs the module")
    return parse_prompts_jsonl(text, source=path)


def load_workload(workload=None, prompts_file=None, num_prompts=None):
    """Prompts for a run: a prompts file wins over the built-in workload; ``num_prompts`` keeps the first N."""
    prompts = load_prompts_file(prompts_file) if prompts_file else builtin_workload(workload or "code_refactor")
    if num_prompts is not None:
        if num_prompts < 1:
            raise ValidationError("must be at least 1, got %r" % (num_prompts,), field="num_prompts")
        prompts = prompts[:num_prompts]
    return prompts


def prompt_classes(prompts):
    """The request classes the prompts name, sorted; empty when none is classified."""
    return sorted({p["class"] for p in prompts if p.get("class")})


def to_jsonl(prompts):
    """Prompts as ``vllm bench serve --dataset-name custom`` JSONL (``{"prompt": ...}`` per line)."""
    return "".join(json.dumps({"prompt": p["prompt"]}) + "\n" for p in prompts)
