# Help text only: an empty memory_reminder / decoding_constraints now means the loaded
# model's default (its profile, else on), not the platform's alone. No schema change.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0027_kvinvalidation_kind'),
    ]

    operations = [
        migrations.AlterField(
            model_name='tenant',
            name='decoding_constraints',
            field=models.BooleanField(blank=True, default=None, help_text="Keep the standing instructions (the tenant's and those in members' memories) that the decoder can keep on every reply: lowercase, capitals, no commas, a banned word, an opening or closing phrase; at any depth of a conversation; the tenant's win over a member's. Empty: the model's default (on unless its profile says off).", null=True),
        ),
        migrations.AlterField(
            model_name='tenant',
            name='memory_reminder',
            field=models.BooleanField(blank=True, default=None, help_text='Re-state members\' memories at the start of their messages deep in a conversation ("(<memories>)" before the message, from the third message on; from the first with several memories). Its tokens count in prompt_tokens. Empty: the model\'s default (on unless its profile says off).', null=True),
        ),
    ]
