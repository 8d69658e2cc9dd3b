from django.db import migrations


def create_auditors(apps, schema_editor):
    from tombstones.roles import apply_auditors

    apply_auditors(apps, using=schema_editor.connection.alias)


def remove_auditors(apps, schema_editor):
    group_model = apps.get_model("auth", "Group")
    group_model.objects.using(schema_editor.connection.alias).filter(name="Auditors").delete()


class Migration(migrations.Migration):

    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("tombstones", "0002_admin_permissions_and_proxies"),
    ]

    operations = [migrations.RunPython(create_auditors, remove_auditors)]
