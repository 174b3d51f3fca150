"""factory_boy factories for the fleet inventory. GPU models and profiles come from the catalog
migration, so tests use NVIDIA's real figures: `profile("RTX6000-12Q")`, `gpu_model("Tesla T4")`."""

import factory
from django.contrib.auth import get_user_model

from fleet.models import Artist, Gpu, GpuModel, Host, VgpuProfile, VirtualMachine

# The PCI bus id of the sizing guide's first GPU, used where a test names a GPU in a message.
BUS = "00000000:3B:00.0"


def gpu_model(name: str = "Quadro RTX 6000") -> GpuModel:
    return GpuModel.objects.get(name=name)


def profile(name: str) -> VgpuProfile:
    return VgpuProfile.objects.select_related("gpu_model").get(name=name)


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pass-word-123")


class HostFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Host

    name = factory.Sequence(lambda n: f"gpu-host-{n:03d}")
    cpu_model = "2 x Xeon Gold 6154"
    cpu_threads = 72
    ram_gib = 768


class GpuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Gpu

    host = factory.SubFactory(HostFactory)
    gpu_model = factory.LazyFunction(gpu_model)
    uuid = factory.Sequence(lambda n: f"GPU-{n:08d}-0000-0000-0000-000000000000")

    @factory.lazy_attribute_sequence
    def pci_bus_id(self, n):
        """The sequence's next bus id that the host does not hold yet: tests' worlds give some GPUs
        a bus id of their own (00000000:3B:00.0), which the sequence would come round to."""
        taken = set(Gpu.objects.filter(host=self.host).values_list("pci_bus_id", flat=True)) if self.host.pk else set()
        return next(bus_id for i in range(251)
                    if (bus_id := f"00000000:{((n + i) % 250) + 1:02X}:00.0") not in taken)


class ArtistFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Artist

    user = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"Artist {n}")
    workflow = "modeling"


class VirtualMachineFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = VirtualMachine

    name = factory.Sequence(lambda n: f"ws-{n:04d}")
    artist = factory.SubFactory(ArtistFactory)
    vcpus = 8
    ram_gib = 32
