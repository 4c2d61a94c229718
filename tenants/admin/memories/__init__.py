"""Members' memories in the admin (issue 22): tenant admins list, add, edit, enable/disable
and delete the memories of their own tenant's members; superusers everyone's. Every write
goes through ``tenants.actions.memories`` (audited with old/new text, the member's cached
segment invalidated); a member's first memory is their preference. The rules read from
each memory are shown, and switched off or on per memory (``rules_enabled``, audited:
``tenants.actions.memory_rules``)."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages

from tenants import actions
from tenants.actions.memories import clean_text, max_per_member
from tenants.admin.scoping import TenantScopedAdmin
from tenants.errors import InvalidInput
from tenants.models import Memory
from tenants.rules import memory_shown


class MemoryForm(forms.ModelForm):
    class Meta:
        model = Memory
        fields = ("member", "text", "enabled", "pinned", "rules_enabled")
        widgets = {"text": forms.Textarea(attrs={"rows": 3, "cols": 80})}

    def clean_text(self):
        try:
            return clean_text(self.cleaned_data.get("text"))
        except InvalidInput as exc:
            raise forms.ValidationError(exc.message) from exc

    def clean(self):
        data = super().clean()
        member, limit = data.get("member"), max_per_member()
        if not self.instance.pk and member is not None and actions.member_memories(
                member).count() >= limit:
            self.add_error("member", f"This member has {limit} memories already (the most "
                                     "allowed, MEMORY_MAX_PER_MEMBER); delete one first.")
        return data


@admin.register(Memory)
class MemoryAdmin(TenantScopedAdmin):
    form = MemoryForm
    list_display = ("member", "text_preview", "enabled", "pinned", "rules_preview",
                    "position", "source", "updated_at")
    list_filter = ("enabled", "pinned", "rules_enabled", "source")
    list_select_related = ("member__user", "member__tenant")
    search_fields = ("member__user__username", "text")
    autocomplete_fields = ("member",)
    actions = ("disable_memories", "enable_memories", "rules_off", "rules_on",
               "delete_selected")

    @admin.display(description="text")
    def text_preview(self, obj: Memory) -> str:
        return obj.text if len(obj.text) <= 80 else obj.text[:79] + "…"

    @admin.display(description="rules")
    def rules_preview(self, obj: Memory) -> str:
        return rules_text(memory_shown(obj))

    @admin.display(description="rules read")
    def rules_read(self, obj: Memory) -> str:
        return rules_text(memory_shown(obj), switch=False)

    def get_fields(self, request, obj=None):
        fields = ("member", "text", "enabled", "pinned", "rules_enabled")
        return fields + ("rules_read", "position", "source", "created_at",
                         "updated_at") if obj else fields

    def get_readonly_fields(self, request, obj=None):
        return ("member", "rules_read", "position", "source", "created_at",
                "updated_at") if obj else ()

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        fields = {"text": data["text"], "enabled": data["enabled"], "pinned": data["pinned"]}
        if change:
            saved = self.run_action(request, actions.do_update_memory, obj.member, obj.pk,
                                    **fields)
        else:
            saved = self.run_action(request, actions.do_create_memory, data["member"],
                                    source=Memory.Source.TENANT_ADMIN, **fields)
        if "rules_enabled" in form.changed_data:  # the switch: its own audited action
            self.run_action(request, actions.do_set_memory_rules_enabled, saved.member,
                            saved.pk, data["rules_enabled"])
        obj.pk, obj.position, obj.source = saved.pk, saved.position, saved.source

    def delete_model(self, request, obj):
        self.run_action(request, actions.do_delete_memory, obj.member, obj.pk)

    def delete_queryset(self, request, queryset):
        for memory in queryset.select_related("member__user", "member__tenant"):
            self.delete_model(request, memory)

    def _each(self, request, queryset, action, *args, **kw) -> int:
        """``action(member, memory id, *args, **kw)`` on each selected memory, audited;
        how many."""
        count = 0
        for memory in queryset.select_related("member__user", "member__tenant"):
            self.run_action(request, action, memory.member, memory.pk, *args, **kw)
            count += 1
        return count

    def _set_enabled(self, request, queryset, enabled: bool) -> None:
        count = self._each(request, queryset, actions.do_update_memory, enabled=enabled)
        state = "enabled" if enabled else "disabled"
        self.message_user(request, f"{count} memory(ies) {state}.", messages.SUCCESS)

    @admin.action(description="Disable selected memories")
    def disable_memories(self, request, queryset):
        self._set_enabled(request, queryset, False)

    @admin.action(description="Enable selected memories")
    def enable_memories(self, request, queryset):
        self._set_enabled(request, queryset, True)

    def _switch_rules(self, request, queryset, enabled: bool) -> None:
        count = self._each(request, queryset, actions.do_set_memory_rules_enabled, enabled)
        state = "on" if enabled else "off"
        self.message_user(request, f"Rules switched {state} for {count} memory(ies).",
                          messages.SUCCESS)

    @admin.action(description="Switch off the rules of selected memories (they stay)")
    def rules_off(self, request, queryset):
        self._switch_rules(request, queryset, False)

    @admin.action(description="Switch on the rules of selected memories")
    def rules_on(self, request, queryset):
        self._switch_rules(request, queryset, True)


def rules_text(shown: dict, *, switch: bool = True) -> str:
    """The rules read from a text, in a line (``tenants.rules.shown``)."""
    parts = list(shown["constraints"])
    if shown["language"]:
        parts.append(f"language: {shown['language']}")
    if shown["standing"]:
        parts.append("standing instruction")
    text = ", ".join(parts) or "none"
    return f"{text} (off)" if switch and not shown["enabled"] and parts else text
