# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The scheduled rollback's settings, checked before anything is rendered, written or applied.

``problems(settings)`` returns one ValidationError per wrong setting of the ``rollback_schedule`` role (what to roll back,
where the manifests go, the Kubernetes names, the CronJob's cron expression); each message names the role variable and the
fix. Names are checked with the collection's DNS-1123 rule (``isvc.check_dns1123``).
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

PREFIX = "rollback_schedule_"
CRON_HINT = 'write a standard 5-field cron expression, e.g. "0 3 * * *"'
REF_HINT = "use lowercase DNS-1123 names, e.g. llama-eagle3 or models/llama-eagle3"
_MONTHS = {m: i + 1 for i, m in enumerate(("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"))}
_DAYS = {d: i for i, d in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
# The five fields of a Kubernetes CronJob schedule: name, lowest, highest, names allowed. The API server parses it with
# robfig/cron v3 (ParseStandard), whose day of week is 0-6 (a 7 for Sunday is refused when the CronJob is applied).
CRON_FIELDS = (("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}), ("month", 1, 12, _MONTHS),
               ("day of week", 0, 6, _DAYS))


def _cron_value(text, names):
    """The number a cron value stands for (digits, or a month/day name), or None."""
    if text.isdigit():
        return int(text)
    return names.get(text.upper())


def _cron_field_problem(text, low, high, names):
    """Why one cron field is wrong ('outside' or 'syntax'), or None. Lists (,), ranges (-), steps (/), * and ? are allowed."""
    for part in text.split(","):
        span, slash, step = part.partition("/")
        if slash and not (step.isdigit() and int(step) >= 1):
            return "syntax"
        if span in ("*", "?"):
            continue
        first, dash, last = span.partition("-")
        values = [_cron_value(v, names) for v in ((first, last) if dash else (first,))]
        if None in values:
            return "syntax"
        if any(v < low or v > high for v in values):
            return "outside"
        if dash and values[0] > values[1]:
            return "syntax"
    return None


def cron_problems(expression, field=PREFIX + "cron"):
    """ValidationErrors for a CronJob schedule: five fields, each within its range."""
    if not isinstance(expression, str):
        return [ValidationError("%r is not a cron expression" % (expression,), field=field, hint=CRON_HINT)]
    fields = expression.split()
    if len(fields) != len(CRON_FIELDS):
        return [ValidationError("'%s' has %d field(s), a CronJob schedule has 5 (minute hour day-of-month month day-of-week)"
                                % (expression, len(fields)), field=field, hint=CRON_HINT)]
    errors = []
    for text, (what, low, high, names) in zip(fields, CRON_FIELDS):
        why = _cron_field_problem(text, low, high, names)
        if why == "outside":
            errors.append(ValidationError("%s field %s is outside %d-%d" % (what, text, low, high), field=field, hint=CRON_HINT))
        elif why == "syntax":
            errors.append(ValidationError("%s field %s is not a cron value (%d-%d, *, lists a,b, ranges a-b, steps */n)"
                                          % (what, text, low, high), field=field, hint=CRON_HINT))
    return errors


def _name_problem(value, field):
    try:
        isvc.check_dns1123(value, field)
    except ValidationError as exc:
        return exc
    return None


def _ref_problem(value, field):
    """An InferenceService (or LLMInferenceService) given as `name` or `namespace/name`."""
    parts = value.split("/")
    if len(parts) <= 2 and not any(_name_problem(part, field) for part in parts):
        return None
    return ValidationError("%s is not an InferenceService name or namespace/name" % value, field=field, hint=REF_HINT)


def problems(settings):
    """Every wrong setting of the rollback_schedule role, as ValidationErrors naming the role variable and the fix.

    ``settings`` keys (the role's variables without the ``rollback_schedule_`` prefix): name, namespace, target_namespaces
    (list), names (list), label_selector, cron, output_dir, apply (bool), resource_kind, kserve_namespace and
    kserve_presets_role (bool; the KServe namespace is only used, and checked, for an LLMInferenceService with the
    presets Role)."""
    errors = []
    names = [str(v) for v in settings.get("names") or []]
    targets = [str(v) for v in settings.get("target_namespaces") or []]
    if not names and not settings.get("label_selector"):
        errors.append(ValidationError("nothing to roll back", field=PREFIX + "names",
                                      hint="set rollback_schedule_names and/or rollback_schedule_label_selector (what to roll back)"))
    if not targets:
        errors.append(ValidationError("is empty", field=PREFIX + "target_namespaces",
                                      hint="list the namespaces the job may roll back in (by default its own namespace)"))
    if not settings.get("output_dir") and not settings.get("apply"):
        errors.append(ValidationError("is empty and rollback_schedule_apply is false: the manifests would go nowhere",
                                      field=PREFIX + "output_dir",
                                      hint="set rollback_schedule_output_dir and/or rollback_schedule_apply: true (where the manifests go)"))
    checked = [(PREFIX + "name", settings.get("name")), (PREFIX + "namespace", settings.get("namespace"))]
    if settings.get("resource_kind") == "LLMInferenceService" and settings.get("kserve_presets_role"):
        checked.append((PREFIX + "kserve_namespace", settings.get("kserve_namespace")))
    checked += [("%starget_namespaces[%d]" % (PREFIX, i), v) for i, v in enumerate(targets)]
    errors += [e for e in (_name_problem(value, field) for field, value in checked) if e]
    errors += [e for e in (_ref_problem(v, "%snames[%d]" % (PREFIX, i)) for i, v in enumerate(names)) if e]
    errors += cron_problems(settings.get("cron"))
    return errors


def messages(settings):
    """``problems`` as plain strings (what the role prints)."""
    return [str(exc) for exc in problems(settings)]
