# The AWS provider of the example environment, mocked for `terraform test` (no account): what the
# environment reads back from AWS and passes on (ARNs, the Redis endpoint, the ALB's idle timeout)
# is given here, so the plan shows the values a real apply would wire together.

mock_data "aws_region" {
  defaults = { name = "us-east-1" }
}
mock_data "aws_partition" {
  defaults = { partition = "aws" }
}
mock_data "aws_caller_identity" {
  defaults = { account_id = "111122223333" }
}
# Policy documents are built by the provider itself: a mock must still be JSON.
mock_data "aws_iam_policy_document" {
  defaults = { json = "{}" }
}
mock_data "aws_ssm_parameter" {
  defaults = { insecure_value = "ami-0latest00000000" }
}
mock_data "aws_vpc" {
  defaults = { cidr_block = "10.40.0.0/16" }
}
mock_data "aws_availability_zones" {
  defaults = { names = ["us-east-1a", "us-east-1b", "us-east-1c"] }
}
mock_data "aws_elb_service_account" {
  defaults = { arn = "arn:aws:iam::127311923021:root" }
}
mock_data "aws_secretsmanager_random_password" {
  defaults = { random_password = "abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz01" }
}

mock_resource "aws_lb" {
  defaults = {
    arn          = "arn:aws:elasticloadbalancing:us-east-1:111122223333:loadbalancer/app/floodgate/abc"
    arn_suffix   = "app/floodgate/abc"
    idle_timeout = 3600
  }
}
mock_resource "aws_lb_target_group" {
  defaults = { arn = "arn:aws:elasticloadbalancing:us-east-1:111122223333:targetgroup/floodgate-edge/abc" }
}
mock_resource "aws_lb_listener" {
  defaults = { arn = "arn:aws:elasticloadbalancing:us-east-1:111122223333:listener/app/floodgate/abc/def" }
}
mock_resource "aws_wafv2_web_acl" {
  defaults = { arn = "arn:aws:wafv2:us-east-1:111122223333:regional/webacl/floodgate/abc" }
}
mock_resource "aws_secretsmanager_secret" {
  defaults = { arn = "arn:aws:secretsmanager:us-east-1:111122223333:secret:floodgate/x" }
}
mock_resource "aws_kms_key" {
  defaults = { arn = "arn:aws:kms:us-east-1:111122223333:key/abc" }
}
mock_resource "aws_dynamodb_table" {
  defaults = { arn = "arn:aws:dynamodb:us-east-1:111122223333:table/floodgate-x" }
}
mock_resource "aws_ecr_repository" {
  defaults = {
    arn            = "arn:aws:ecr:us-east-1:111122223333:repository/floodgate/x"
    repository_url = "111122223333.dkr.ecr.us-east-1.amazonaws.com/floodgate/x"
  }
}
mock_resource "aws_s3_bucket" {
  defaults = { arn = "arn:aws:s3:::floodgate-x" }
}
mock_resource "aws_sns_topic" {
  defaults = { arn = "arn:aws:sns:us-east-1:111122223333:floodgate-alarms" }
}
mock_resource "aws_cloudwatch_log_group" {
  defaults = { arn = "arn:aws:logs:us-east-1:111122223333:log-group:/floodgate/x" }
}
mock_resource "aws_iam_role" {
  defaults = { arn = "arn:aws:iam::111122223333:role/floodgate-x" }
}
mock_resource "aws_iam_instance_profile" {
  defaults = { arn = "arn:aws:iam::111122223333:instance-profile/x" }
}
mock_resource "aws_iam_service_linked_role" {
  defaults = { arn = "arn:aws:iam::111122223333:role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling" }
}
mock_resource "aws_autoscaling_policy" {
  defaults = { arn = "arn:aws:autoscaling:us-east-1:111122223333:scalingPolicy:abc:autoScalingGroupName/x:policyName/y" }
}
mock_resource "aws_ecs_cluster" {
  defaults = { arn = "arn:aws:ecs:us-east-1:111122223333:cluster/floodgate" }
}
mock_resource "aws_ecs_task_definition" {
  defaults = { arn = "arn:aws:ecs:us-east-1:111122223333:task-definition/floodgate-edge:1" }
}
mock_resource "aws_acm_certificate" {
  defaults = {
    arn = "arn:aws:acm:us-east-1:111122223333:certificate/abc"
    domain_validation_options = [{
      domain_name           = "api.example.com"
      resource_record_name  = "_x.api.example.com"
      resource_record_type  = "CNAME"
      resource_record_value = "_y.acm-validations.aws"
    }]
  }
}
mock_resource "aws_acm_certificate_validation" {
  defaults = { certificate_arn = "arn:aws:acm:us-east-1:111122223333:certificate/abc" }
}
mock_resource "aws_elasticache_replication_group" {
  defaults = { configuration_endpoint_address = "clustercfg.floodgate-limiter.abc123.use1.cache.amazonaws.com" }
}
