"""Prepare a freshly started moto server for the EC2 plugin's tests.

Run by `cargo xtask test` / `cargo xtask moto` (xtask/src/moto.rs) with the venv's Python:

    python moto_setup.py URL REGION INSTANCE_TYPE

1. Creates an IAM user with an inline policy allowing ec2:*, and an access key for it.
2. Picks what moto accepts under its validations: an AMI of the region (Amazon-owned,
   x86_64, EBS root on /dev/xvda, an id the plugin's config accepts), a zone, and checks
   the instance type is offered in that zone.
3. Turns signature checking on (POST /moto-api/reset-auth, body "0").
4. Proves it: a signed call with the new key succeeds, the same call with a wrong secret
   is refused. Exits non-zero (with the reason on stderr) when anything is off.

On success it prints one JSON object on stdout: accessKeyId, secretAccessKey, region,
zone, image, instanceType.
"""

import json
import re
import sys
import urllib.request

import boto3
import botocore.config
from botocore.exceptions import ClientError

USER = "egress-proxy-operator-test"
POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "ec2:*", "Resource": "*"}],
}
# What the plugin's config accepts as an AMI id.
AMI_ID = re.compile(r"^ami-([0-9a-f]{8}|[0-9a-f]{17})$")
# No retries: a refusal must show as a refusal, at once.
BOTO = botocore.config.Config(retries={"max_attempts": 1}, connect_timeout=5, read_timeout=60)


def fail(msg):
    print(f"moto setup: {msg}", file=sys.stderr)
    sys.exit(1)


def client(service, url, region, key, secret):
    return boto3.client(
        service,
        endpoint_url=url,
        region_name=region,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=BOTO,
    )


def pick_image(ec2):
    images = ec2.describe_images(
        Owners=["amazon"],
        Filters=[
            {"Name": "architecture", "Values": ["x86_64"]},
            {"Name": "root-device-type", "Values": ["ebs"]},
        ],
    )["Images"]
    usable = [
        i
        for i in images
        if AMI_ID.match(i["ImageId"])
        and i.get("RootDeviceName") == "/dev/xvda"
        and i.get("State", "available") == "available"
    ]
    if not usable:
        fail(f"no usable AMI among {len(images)} Amazon-owned x86_64 EBS images")
    # Plain Amazon Linux 2 first, the newest by name (moto stamps every image with its
    # start time, so CreationDate says nothing); then any, by id. The same pick on every
    # run of one moto version.
    def rank(i):
        name = i.get("Name", "")
        plain = name.startswith("amzn2-ami-hvm-") and name.endswith("-x86_64-gp2")
        return (plain, name, i["ImageId"])

    return max(usable, key=rank)["ImageId"]


def pick_zone(ec2, instance_type):
    zones = sorted(
        z["ZoneName"]
        for z in ec2.describe_availability_zones()["AvailabilityZones"]
        if z.get("State", "available") == "available"
    )
    if not zones:
        fail("the region has no availability zone")
    offered = {
        o["Location"]
        for o in ec2.describe_instance_type_offerings(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [instance_type]}],
        )["InstanceTypeOfferings"]
    }
    for z in zones:
        if z in offered:
            return z
    fail(f"instance type {instance_type} is offered in none of {zones}")


def main():
    if len(sys.argv) != 4:
        fail("usage: moto_setup.py URL REGION INSTANCE_TYPE")
    url, region, instance_type = sys.argv[1:]

    # Auth is still off: any key is accepted for the setup calls.
    iam = client("iam", url, region, "setup", "setup")
    iam.create_user(UserName=USER)
    iam.put_user_policy(
        UserName=USER, PolicyName="ec2-all", PolicyDocument=json.dumps(POLICY)
    )
    key = iam.create_access_key(UserName=USER)["AccessKey"]
    key_id, secret = key["AccessKeyId"], key["SecretAccessKey"]

    ec2 = client("ec2", url, region, key_id, secret)
    image = pick_image(ec2)
    zone = pick_zone(ec2, instance_type)

    req = urllib.request.Request(
        f"{url}/moto-api/reset-auth",
        data=b"0",
        headers={"Content-Type": "text/plain"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        if resp.status != 200:
            fail(f"reset-auth answered HTTP {resp.status}")

    try:
        ec2.describe_instances()
    except ClientError as e:
        fail(f"with auth on, the test user's own key is refused: {e}")
    wrong = client("ec2", url, region, key_id, secret[:-1] + ("A" if secret[-1] != "A" else "B"))
    try:
        wrong.describe_instances()
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code not in ("AuthFailure", "SignatureDoesNotMatch", "InvalidClientTokenId"):
            fail(f"a wrong secret was refused, but with {code!r}: {e}")
    else:
        fail("signature checking is not on: a call with a wrong secret key succeeded")

    print(
        json.dumps(
            {
                "accessKeyId": key_id,
                "secretAccessKey": secret,
                "region": region,
                "zone": zone,
                "image": image,
                "instanceType": instance_type,
            }
        )
    )


if __name__ == "__main__":
    main()
