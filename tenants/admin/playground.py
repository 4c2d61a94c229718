"""/admin/playground/: a tenant admin (or superuser) compares one of their members' reply
with and without the member's personalisation, optionally with an unsaved preference.

Without JavaScript the form posts and the page shows both replies when both are done. With
it, the page streams: ``start/`` validates the same form and enqueues both replies (the
run is kept in the admin's session, bound to it), ``stream/<run>/<variant>/`` relays one
reply as server-sent events, and ``record/<run>/`` (sent when both are done, or as a beacon
when the page is left earlier) audits the use and saves the exchange if asked.
"""

from __future__ import annotations

import uuid

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from tenants import actions, playground
from tenants.actions import PREFERENCE_MAX_CHARS
from tenants.admin.memories import rules_text
from tenants.admin.scoping import admin_scope, scope_queryset
from tenants.api.streaming import event_stream
from tenants.errors import PlatformError
from tenants.models import Member
from tenants.rules import memory_shown

MESSAGE_MAX_CHARS = 4000
SESSION_KEY = "kvi_playground"
KEEP_RUNS = 4  # streamed runs remembered per admin session
RECORD_WAIT_SECONDS = 5.0  # a reply not done by then is recorded as not answered


class PlaygroundForm(forms.Form):
    member = forms.ModelChoiceField(queryset=Member.objects.none())
    message = forms.CharField(max_length=MESSAGE_MAX_CHARS, strip=True,
                              widget=forms.Textarea(attrs={"rows": 3, "cols": 80}))
    preference = forms.CharField(
        required=False, max_length=PREFERENCE_MAX_CHARS, strip=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text="The member's saved preference. Edit it to try a change before saving it: "
                  "an edited text is computed for this page only, never cached or stored.")
    alpha = forms.FloatField(required=False, min_value=0.0, max_value=1.0,
                             help_text="Strength, 0 to 1 (empty: the member's own).")
    contrast = forms.FloatField(required=False, min_value=0.0, max_value=4.0,
                                help_text="Contrastive guidance by the memories, 0 to 4 "
                                          "(0: off; empty: the tenant's, else the model's).")
    save = forms.BooleanField(required=False,
                              label="Also save the personalised exchange to the member's "
                                    "history")

    def __init__(self, members, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["member"].queryset = members


def _members(request):
    scope = admin_scope(request)
    if scope is None:
        raise PermissionDenied("Only tenant admins and superusers may use the playground.")
    return scope_queryset(Member.objects.select_related("user", "tenant"), scope)


def _initial(members, member_id: str | None) -> dict:
    if not member_id:
        return {}
    member = members.filter(pk=member_id).first() if member_id.isdigit() else None
    if member is None:  # unknown and foreign members alike
        raise Http404("No such member.")
    pref = member.own_preference()
    return {"member": member, "preference": pref.text if pref else "",
            "alpha": pref.alpha if pref else None}


def _override(member: Member, text: str, alpha: float | None):
    """(preference_text, alpha) to send: None, None when the form shows the saved one."""
    pref = member.own_preference()
    if pref is not None and text == pref.text and alpha in (None, pref.alpha):
        return None, None
    return text, alpha


def _member_rules(member: Member | None) -> list[dict]:
    """The rules read from each of ``member``'s memories (issue 57), as the page lists them."""
    if member is None:
        return []
    return [{"id": m.pk, "text": m.text if len(m.text) <= 60 else m.text[:59] + "…",
             "rules": rules_text(memory_shown(m)), "enabled": m.enabled}
            for m in actions.member_memories(member)]


def playground_view(request):
    members = _members(request)
    context = {**admin.site.each_context(request), "title": "Playground"}
    initial = _initial(members, request.GET.get("member"))
    if request.method != "POST":
        form = PlaygroundForm(members, initial=initial)
    elif "_try" in request.POST:  # from a preference's change page: its unsaved edit
        form = PlaygroundForm(members, initial={**initial, "preference": request.POST.get(
            "text", ""), "alpha": request.POST.get("alpha") or initial.get("alpha")})
    else:
        form = PlaygroundForm(members, request.POST)
        if form.is_valid():
            context.update(_run(request, form.cleaned_data))
            initial = {"member": form.cleaned_data["member"]}
    context["member_rules"] = _member_rules(initial.get("member"))
    return TemplateResponse(request, "admin/kvi_playground.html", {**context, "form": form})


def _run(request, data: dict) -> dict:
    member = data["member"]
    text, alpha = _override(member, data["preference"], data["alpha"])
    try:
        results = playground.compare(member.pk, data["message"], preference_text=text,
                                     alpha=alpha, contrast=data.get("contrast"))
    except PlatformError as exc:
        return {"error": exc.message}
    saved = actions.do_record_playground(member, message=data["message"], results=results,
                                         unsaved_preference=text is not None,
                                         save=data["save"], actor=request.user)
    return {"results": results, "unsaved": text is not None, "saved": saved,
            "ran_for": member}


@require_POST
def playground_start(request):
    """Validate the form and enqueue both replies streaming; JSON for the page's script."""
    members = _members(request)
    form = PlaygroundForm(members, request.POST)
    if not form.is_valid():
        return JsonResponse({"errors": form.errors.get_json_data()}, status=400)
    data = form.cleaned_data
    member = data["member"]
    text, alpha = _override(member, data["preference"], data["alpha"])
    try:
        tasks = playground.start(member.pk, data["message"], preference_text=text, alpha=alpha,
                                 contrast=data.get("contrast"))
    except PlatformError as exc:
        return JsonResponse({"error": exc.message}, status=exc.status)
    run = uuid.uuid4().hex
    runs = dict(list(request.session.get(SESSION_KEY, {}).items())[-(KEEP_RUNS - 1):])
    runs[run] = {"member": member.pk, "message": data["message"], "tasks": tasks,
                 "unsaved": text is not None, "save": data["save"]}
    request.session[SESSION_KEY] = runs
    return JsonResponse({
        "run": run, "member": str(member), "unsaved": text is not None,
        "streams": {v: reverse("admin-playground-stream", args=(run, v)) for v in tasks},
        "record": reverse("admin-playground-record", args=(run,)),
    })


def _run_state(request, run: str, members) -> tuple[dict, Member]:
    """This session's run ``run`` and its member, still in the admin's scope; else 404."""
    state = request.session.get(SESSION_KEY, {}).get(run)
    member = members.filter(pk=state["member"]).first() if state else None
    if member is None:
        raise Http404("No such playground run.")
    return state, member


@require_GET
def playground_stream(request, run: str, variant: str):
    state, _ = _run_state(request, run, _members(request))
    task_id = state["tasks"].get(variant)
    if task_id is None:
        raise Http404("No such reply.")
    return event_stream(request, task_id, playground.events(task_id))


@require_POST
def playground_record(request, run: str):
    """Audit the run (once) and save its exchange if asked; the run is then forgotten."""
    state, member = _run_state(request, run, _members(request))
    runs = request.session[SESSION_KEY]
    runs.pop(run)
    request.session[SESSION_KEY] = runs
    request.session.save()  # before the wait: a second record finds nothing
    results = playground.collect(state["tasks"], RECORD_WAIT_SECONDS)
    saved = actions.do_record_playground(member, message=state["message"], results=results,
                                         unsaved_preference=state["unsaved"],
                                         save=state["save"], actor=request.user)
    return JsonResponse({"recorded": True, "saved": saved})
