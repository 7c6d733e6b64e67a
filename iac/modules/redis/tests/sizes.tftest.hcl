# The limiter's Redis planned against a mocked AWS provider (no account needed): the cluster's sizes
# AWS would refuse, or the provider would not send, are refused at plan.

mock_provider "aws" {
  override_during = plan

  mock_data "aws_secretsmanager_random_password" {
    defaults = { random_password = "0123456789abcdef0123456789abcdef" }
  }
}

variables {
  name                      = "fg"
  vpc_id                    = "vpc-1"
  private_subnet_ids        = ["subnet-a", "subnet-b"]
  client_security_group_ids = ["sg-edge"]
  kms_key_arn               = "arn:aws:kms:us-east-1:111122223333:key/abc"
}

run "the_default_cluster" {
  command = plan

  assert {
    condition     = aws_elasticache_replication_group.this.num_node_groups == 2 && aws_elasticache_replication_group.this.replicas_per_node_group == 1
    error_message = "two shards of a primary and a replica by default"
  }
}

# The provider leaves a num_node_groups of 0 out of CreateReplicationGroup (AWS then makes one
# shard, and every later plan tries to reshard it to none) and sends a negative one, which AWS
# refuses only at apply, the token secret, security group and parameter group made; past 500
# likewise (a cluster's most shards).
run "no_shard" {
  command = plan

  variables {
    shards = 0
  }

  expect_failures = [var.shards]
}

run "more_shards_than_a_cluster_takes" {
  command = plan

  variables {
    shards = 501
  }

  expect_failures = [var.shards]
}

# Automatic failover and Multi-AZ, both on, need a replica in every shard (the provider checks 0 to
# 5 only): AWS refused 0 only at apply.
run "no_replica" {
  command = plan

  variables {
    replicas_per_shard = 0
  }

  expect_failures = [var.replicas_per_shard]
}
