# The VPC's zones planned against a mocked AWS provider (no account needed). The zones data source
# filters DescribeAvailabilityZones by name, and a filter that matches nothing is no error: a zone
# the region does not have (a typo, or zones left at us-east-1's while `region` names another) was
# silently dropped, and the plan went on with fewer subnets than asked, none at all for another
# region's zones. The load balancer (two zones at least), multi-AZ Redis and the NAT routes then
# failed at apply, half-way. What AWS answers such a filter is given by override_data.

mock_provider "aws" {
  override_during = plan

  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
  mock_data "aws_iam_policy_document" {
    defaults = { json = "{}" }
  }
  mock_data "aws_availability_zones" {
    defaults = { names = ["us-east-1a", "us-east-1b", "us-east-1c"] }
  }
}

variables {
  name               = "fg"
  kms_key_arn        = "arn:aws:kms:us-east-1:111122223333:key/abc"
  availability_zones = ["us-east-1a", "us-east-1b", "us-east-1c"]
}

run "the_named_zones_get_a_subnet_each" {
  command = plan

  assert {
    condition     = length(aws_subnet.private) == 3 && length(aws_subnet.public) == 3
    error_message = "one public and one private subnet in each of the three named zones"
  }
}

# `region = "eu-west-1"` with availability_zones left at the default us-east-1 zones: AWS matches
# none of them.
run "zones_of_another_region" {
  command = plan

  override_data {
    target = data.aws_availability_zones.selected
    values = { names = [] }
  }

  expect_failures = [data.aws_availability_zones.selected]
}

# A typo: AWS answers the one zone that exists, and the plan would have made one subnet of each kind.
run "a_zone_the_region_does_not_have" {
  command = plan

  variables {
    availability_zones = ["us-east-1a", "us-east-1x"]
  }

  override_data {
    target = data.aws_availability_zones.selected
    values = { names = ["us-east-1a"] }
  }

  expect_failures = [data.aws_availability_zones.selected]
}

# Two entries, one zone: the length check alone let it through.
run "one_zone_named_twice" {
  command = plan

  variables {
    availability_zones = ["us-east-1a", "us-east-1a"]
  }

  override_data {
    target = data.aws_availability_zones.selected
    values = { names = ["us-east-1a"] }
  }

  expect_failures = [var.availability_zones]
}
