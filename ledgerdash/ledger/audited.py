"""The base of every table that says who may do what, or how a tool reaches
its provider: tenants, memberships, on-call shifts, policies, tools and
tenants' credential bindings.

Writing one of these rows is a configuration change, and every
configuration change is an event in the affected tenants' chains
(:mod:`ledgerdash.ledger.configuration` decides which event). The hook sits
on the rows themselves, not on the pages that edit them, so no path of the
application can change configuration without its event: ``save()`` (the
admin, the dashboard, ``create``/``get_or_create``/``update_or_create``),
``QuerySet.update()`` and ``bulk_create``/``bulk_update`` (which Django's
signals never see) are all overridden here, and deletes (also cascades, such
as deleting a user) are caught by the ``pre_delete`` signal, which Django
sends inside the deletion's own transaction. The change and its event commit
together or not at all.

This module only calls the hook; :mod:`ledgerdash.ledger.configuration`
installs it (at import, which the ledger's app config does when Django
starts), so the models never import what builds on them. A write before
that is refused, never let through unrecorded.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured
from django.db import models, transaction


class Recorder(Protocol):
    """What records configuration changes (:mod:`ledgerdash.ledger.configuration`)."""

    def snapshot(self, row: Any) -> Any: ...
    def record_change(self, *, before: Any, instance: Any, deleted: bool = False) -> None: ...
    def refuse_delete(self, model: type[Any]) -> None: ...
    def refuse_bulk_conflicts(self) -> None: ...


_recorder: Recorder | None = None


def install(recorder: Recorder) -> None:
    """Make ``recorder`` the one that turns every configuration write into events."""
    global _recorder
    _recorder = recorder


def recorder() -> Recorder:
    if _recorder is None:
        raise ImproperlyConfigured(
            "configuration changes cannot be recorded yet: the ledger app is not ready (django.setup())"
        )
    return _recorder


class AuditedQuerySet(models.QuerySet[Any]):
    def update(self, **kwargs: Any) -> int:
        hook = recorder()
        with transaction.atomic(using=self.db):
            rows = list(self.select_for_update())
            before = {row.pk: hook.snapshot(row) for row in rows}
            count = super().update(**kwargs)
            after = self.model._base_manager.using(self.db).filter(pk__in=list(before))
            for row in after:
                hook.record_change(before=before[row.pk], instance=row)
        return count

    def delete(self) -> tuple[int, dict[str, int]]:
        hook = recorder()
        hook.refuse_delete(self.model)
        return super().delete()

    def bulk_create(self, objs: Iterable[Any], *args: Any, **kwargs: Any) -> list[Any]:
        hook = recorder()
        if kwargs.get("update_conflicts") or kwargs.get("ignore_conflicts"):
            hook.refuse_bulk_conflicts()
        with transaction.atomic(using=self.db):
            created = super().bulk_create(objs, *args, **kwargs)
            for row in created:
                hook.record_change(before=None, instance=row)
        return created


class AuditedModel(models.Model):
    """A configuration row: every write is an event (see the module)."""

    objects = AuditedQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        hook = recorder()
        using = kwargs.get("using") or self._state.db or "default"
        with transaction.atomic(using=using):
            before = None
            if not self._state.adding and self.pk is not None:
                current = type(self)._base_manager.using(using).select_for_update().filter(pk=self.pk).first()
                before = hook.snapshot(current) if current is not None else None
            super().save(*args, **kwargs)
            hook.record_change(before=before, instance=self)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        hook = recorder()
        hook.refuse_delete(type(self))
        return super().delete(*args, **kwargs)
