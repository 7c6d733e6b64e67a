# The repository's lifecycle policy planned against a mocked AWS provider (no account needed).

mock_provider "aws" {
  override_during = plan
}

variables {
  name        = "fg/edge"
  kms_key_arn = "arn:aws:kms:us-east-1:111122223333:key/abc"
}

# The policy kept the 30 most recent images of any tag. A team pushing an image per merge and
# deploying weekly had the deployed one expired after 30 merges: the next task or GPU host launched
# (a scale-out at the peak, a replaced task, a host from outside the warm pool) could not pull its
# image (CannotPullContainerError; the host abandoned its launch, again and again). The deployed
# tags now each have a rule of their own ahead of the count: ECR never expires an image that a
# higher-priority rule selects, and one tag (immutable) never holds more than the one image kept.
run "the_deployed_tags_never_expire" {
  command = plan

  variables {
    protected_tags = ["2026-11-29.1", "2026-11-29.1"]
  }

  assert {
    condition = [
      for rule in jsondecode(aws_ecr_lifecycle_policy.this.policy).rules : rule.rulePriority
      if try(rule.selection.tagPatternList, []) == ["2026-11-29.1"] && rule.selection.tagStatus == "tagged" && rule.selection.countType == "imageCountMoreThan" && rule.selection.countNumber >= 1
    ] == [1]
    error_message = "The deployed tag must be selected once, by the first rule, which keeps its one image."
  }

  assert {
    condition = [
      for rule in jsondecode(aws_ecr_lifecycle_policy.this.policy).rules : rule.rulePriority
      if rule.selection.tagStatus == "any"
    ] == [2]
    error_message = "The count over every tag must come after the deployed tags' rules (ECR evaluates an \"any\" rule last)."
  }
}

run "without_deployed_tags_the_count_alone" {
  command = plan

  assert {
    condition     = [for rule in jsondecode(aws_ecr_lifecycle_policy.this.policy).rules : [rule.rulePriority, rule.selection.tagStatus, rule.selection.countNumber]] == [[1, "any", 30]]
    error_message = "Without deployed tags the policy keeps the 30 most recent images."
  }
}
