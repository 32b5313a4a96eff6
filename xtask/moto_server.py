"""moto's server (`moto_server -H HOST -p PORT`), with one correction and a watchdog.

Run by xtask/src/moto.rs with the venv's Python:

    python moto_server.py -H 127.0.0.1 -p PORT

The correction: EC2 lets RunInstances name the AMI's root device in a block device
mapping with only `Ebs.DeleteOnTermination` (the size comes from the AMI's snapshot), which
is how the EC2 plugin makes sure the root volume goes with the instance. moto refuses every
mapping without `Ebs.VolumeSize` or `Ebs.SnapshotId` ("MissingParameter: size or
snapshotId"), so no launch of the plugin's would pass. Here a size-less mapping of the AMI's
own root device is accepted and given moto's default root size (8 GiB); any other size-less
mapping is still refused, as EC2 does. Nothing else of moto is changed.

The watchdog: the server exits when the process that started it is gone, so a killed
`cargo xtask` never leaves a server behind.
"""

import os
import sys
import threading
import time

from moto.ec2.responses.instances import InstanceResponse
from moto.server import main

# moto's own root volume size (Instance.setup_defaults).
ROOT_VOLUME_GIB = 8


def _root_device(response):
    """The root device name of the request's AMI; None when moto does not know the AMI
    (then its AMI validation answers InvalidAMIID.NotFound, as EC2 would)."""
    image_id = response._get_param("ImageId")
    if not image_id:
        return None
    try:
        images = response.ec2_backend.describe_images(ami_ids=[image_id])
    except Exception:
        return None
    return images[0].root_device_name if images else None


def _sizeless(mapping):
    """An EBS mapping with neither a size nor a snapshot."""
    ebs = mapping.get("Ebs")
    return (
        isinstance(ebs, dict)
        and not mapping.get("NoDevice")
        and not ebs.get("VolumeSize")
        and not ebs.get("SnapshotId")
    )


def patch():
    original_validate = InstanceResponse.__dict__["_validate_block_device_mapping"]
    original_parse = InstanceResponse._parse_block_device_mapping
    if not isinstance(original_validate, staticmethod):
        sys.exit("moto_server.py: moto's block device validation changed; review the patch")
    original_validate = original_validate.__func__

    def validate(self, mapping):
        if _sizeless(mapping):
            root = _root_device(self)
            if root is None or mapping.get("DeviceName") == root:
                return
        original_validate(mapping)

    def parse(self):
        mappings = original_parse(self)
        root = _root_device(self)
        for m in mappings:
            if root and m.get("DeviceName") == root and _sizeless(m):
                m["Ebs"]["VolumeSize"] = ROOT_VOLUME_GIB
        return mappings

    # Called as self._validate_block_device_mapping(mapping): a plain method gets self.
    InstanceResponse._validate_block_device_mapping = validate
    InstanceResponse._parse_block_device_mapping = parse


def watchdog():
    parent = os.getppid()
    while True:
        time.sleep(1)
        if os.getppid() != parent:
            os._exit(0)


if __name__ == "__main__":
    patch()
    threading.Thread(target=watchdog, daemon=True).start()
    main(sys.argv[1:])
