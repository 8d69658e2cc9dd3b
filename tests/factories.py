"""factory-boy factories for the demo models."""

from __future__ import annotations

import factory

from project.customers.models import Customer, SheetRow


class CustomerFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Customer

    reference = factory.Sequence(lambda n: f"C-{n:05d}")
    name = factory.Sequence(lambda n: f"Customer Name {n}")
    email = factory.Sequence(lambda n: f"customer{n}@example.test")
    phone = factory.Sequence(lambda n: f"+1555{n:07d}")


class SheetRowFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SheetRow

    customer = factory.SubFactory(CustomerFactory)
    reference = factory.LazyAttribute(lambda row: f"row-{row.customer.reference}")
