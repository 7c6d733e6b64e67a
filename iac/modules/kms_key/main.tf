# One customer-managed key for the deployment's data at rest: logs, secrets, the messages table,
# engines, EBS volumes of the GPU hosts, the alarm topic. The key policy names each AWS service that
# must use it on our behalf; everything else goes through IAM policies of the account.

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}
data "aws_partition" "current" {}

# Auto Scaling launches the GPU hosts through its service-linked role, which the key policy must
# name. A fresh account has no such role until its first Auto Scaling group, and KMS rejects a key
# policy that names a principal that does not exist: create it here (set
# create_autoscaling_service_linked_role = false where the account already has it; creating it
# twice fails with "has been taken").
resource "aws_iam_service_linked_role" "autoscaling" {
  count            = var.create_autoscaling_service_linked_role ? 1 : 0
  aws_service_name = "autoscaling.amazonaws.com"
}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  region     = data.aws_region.current.name
  autoscaling_role_arn = (var.create_autoscaling_service_linked_role
    ? aws_iam_service_linked_role.autoscaling[0].arn
    : "arn:${local.partition}:iam::${local.account_id}:role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"
  )
}

data "aws_iam_policy_document" "key" {
  #checkov:skip=CKV_AWS_111:a key policy's "*" resource means this key only
  #checkov:skip=CKV_AWS_356:a key policy's "*" resource means this key only
  #checkov:skip=CKV_AWS_109:a key policy's "*" resource means this key only; the account root administers it as AWS requires
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account_id}:root"]
    }
  }

  statement {
    sid       = "CloudWatchLogsEncrypts"
    actions   = ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"]
    resources = ["*"]
    principals {
      type        = "Service"
      identifiers = ["logs.${local.region}.amazonaws.com"]
    }
    condition {
      test     = "ArnLike"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:${local.partition}:logs:${local.region}:${local.account_id}:*"]
    }
  }

  # Auto Scaling launches the GPU hosts with EBS volumes encrypted by this key.
  statement {
    sid       = "AutoScalingUsesKeyForEbs"
    actions   = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = [local.autoscaling_role_arn]
    }
  }

  statement {
    sid       = "AutoScalingGrantsForEbs"
    actions   = ["kms:CreateGrant"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = [local.autoscaling_role_arn]
    }
    condition {
      test     = "Bool"
      variable = "kms:GrantIsForAWSResource"
      values   = ["true"]
    }
  }

  # Alarms publish to the encrypted SNS topic.
  statement {
    sid       = "CloudWatchAlarmsPublish"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey*"]
    resources = ["*"]
    principals {
      type        = "Service"
      identifiers = ["cloudwatch.amazonaws.com"]
    }
  }
}

resource "aws_kms_key" "this" {
  description             = "${var.name}: data at rest"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.key.json
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}"
  target_key_id = aws_kms_key.this.key_id
}
