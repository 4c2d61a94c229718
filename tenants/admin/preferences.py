"""Preference admin: versioned edits (a concurrent change is never overwritten), bulk
enable/disable of injection."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import admin, messages

from tenants import actions
from tenants.admin.memories import rules_text
from tenants.admin.scoping import TenantScopedAdmin
from tenants.models import Preference


class PreferenceForm(forms.ModelForm):
    # The version the editor saw; a concurrent change (API, another admin) is not overwritten.
    seen_version = forms.IntegerField(widget=forms.HiddenInput, required=False)
    # the preference's rules switch: its first memory's (tenants.actions.memory_rules)
    rules_enabled = forms.BooleanField(
        required=False, initial=True, label="Rules on",
        help_text="Off: the preference stays in replies, but no rule read from it is applied "
                  "(no decoding constraint, no language guidance, not a standing instruction).")

    class Meta:
        model = Preference
        fields = ("member", "text", "enabled", "alpha")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cap = settings.KV_ALPHA_CAP
        self.fields["alpha"].help_text = (
            "How strongly the preference shapes replies, from 0 (not at all) to 1 (exactly "
            "as if it were written in the prompt; recommended). Values of 0.1 or below "
            f"inject nothing. This platform caps alpha at {cap:g} (KV_ALPHA_CAP): "
            + ("any value is applied as stored." if cap >= 1.0 else
               f"a higher value is stored as entered but applied as {cap:g}."))
        if self.instance.pk:
            self.fields["seen_version"].initial = self.instance.version
            self.fields["rules_enabled"].initial = actions.preference_rules(
                self.instance.member)["enabled"]

    def clean_member(self):
        member = self.cleaned_data["member"]
        if not self.instance.pk and Preference.objects.filter(member=member).exists():
            raise forms.ValidationError("This member already has a preference; edit it.")
        return member

    def clean(self):
        data = super().clean()
        seen = data.get("seen_version")
        if self.instance.pk and seen is not None:
            current = Preference.objects.filter(pk=self.instance.pk).values_list(
                "version", flat=True).first()
            if current is not None and current != seen:
                raise forms.ValidationError(
                    f"This preference was changed elsewhere (now version {current}) after "
                    "you opened it. Reload the page to see the current text.")
        if "text" in data and len(data["text"]) > actions.PREFERENCE_MAX_CHARS:
            self.add_error("text", f"At most {actions.PREFERENCE_MAX_CHARS} characters.")
        return data


@admin.register(Preference)
class PreferenceAdmin(TenantScopedAdmin):
    form = PreferenceForm
    list_display = ("member", "enabled", "alpha", "version", "updated_at", "text_preview")
    list_filter = ("enabled",)
    list_select_related = ("member__user", "member__tenant")
    search_fields = ("member__user__username", "text")
    autocomplete_fields = ("member",)
    readonly_fields = ("version", "updated_at", "content_hash", "alpha_applied", "rules_read")
    actions = ("disable_injection", "enable_injection", "delete_selected")

    @admin.display(description="text")
    def text_preview(self, obj: Preference) -> str:
        return obj.text if len(obj.text) <= 60 else obj.text[:59] + "…"

    @admin.display(description="alpha applied")
    def alpha_applied(self, obj: Preference) -> str:
        cap = settings.KV_ALPHA_CAP
        if obj.alpha <= cap:
            return f"{obj.alpha:g}"
        return f"{cap:g} (stored {obj.alpha:g}, capped by KV_ALPHA_CAP={cap:g})"

    @admin.display(description="rules read")
    def rules_read(self, obj: Preference) -> str:
        return rules_text(actions.preference_rules(obj.member), switch=False)

    def get_fields(self, request, obj=None):
        fields = ("member", "text", "enabled", "alpha", "rules_enabled", "seen_version")
        return fields + self.readonly_fields if obj is not None else fields

    def get_readonly_fields(self, request, obj=None):
        return ("member", *self.readonly_fields) if obj is not None else ()

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        member = obj.member
        pref = self.run_action(request, actions.do_set_preference, member, text=data["text"],
                               enabled=data["enabled"], alpha=data["alpha"],
                               expected_version=data.get("seen_version") if change else None)
        if "rules_enabled" in form.changed_data:  # its first memory's, audited
            self.run_action(request, actions.do_change_preference, member,
                            rules_enabled=data["rules_enabled"])
        pref.refresh_from_db()
        obj.pk, obj.version, obj.updated_at = pref.pk, pref.version, pref.updated_at

    def delete_model(self, request, obj):
        self.run_action(request, actions.do_delete_preference, obj.member)

    def delete_queryset(self, request, queryset):
        for pref in queryset.select_related("member__user", "member__tenant"):
            self.run_action(request, actions.do_delete_preference, pref.member)

    def _set_enabled(self, request, queryset, enabled: bool) -> None:
        count = 0
        for pref in queryset.select_related("member__user", "member__tenant"):
            self.run_action(request, actions.do_set_preference, pref.member, enabled=enabled)
            count += 1
        state = "enabled" if enabled else "disabled"
        self.message_user(request, f"Injection {state} for {count} preference(s).",
                          messages.SUCCESS)

    @admin.action(description="Disable injection for selected preferences")
    def disable_injection(self, request, queryset):
        self._set_enabled(request, queryset, False)

    @admin.action(description="Enable injection for selected preferences")
    def enable_injection(self, request, queryset):
        self._set_enabled(request, queryset, True)
