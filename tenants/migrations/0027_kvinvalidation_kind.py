# A links-only invalidation kind in the outbox: deleting a conversation drops exactly its
# cached links (KVInvalidation.Kind.LINKS), not its member's whole K/V. Existing rows are
# of the member-or-tenant kind ("scope"), as every row was before.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0026_audit_chat_failed'),
    ]

    operations = [
        migrations.AddField(
            model_name='kvinvalidation',
            name='conversation_ref',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='kvinvalidation',
            name='kind',
            field=models.CharField(choices=[('scope', 'member or tenant K/V'), ('links', "one conversation's links")], default='scope', max_length=8),
        ),
        migrations.AddConstraint(
            model_name='kvinvalidation',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('conversation_ref__isnull', True), ('kind', 'scope')), models.Q(('conversation_ref__isnull', False), ('kind', 'links'), ('member_ref__isnull', False)), _connector='OR'), name='kvinval_kind_scope'),
        ),
    ]
