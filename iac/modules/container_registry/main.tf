# One image repository: immutable tags (a tag always means the same image, so an instance refresh
# or a task restart never picks up something else), scanned on push, KMS-encrypted.

resource "aws_ecr_repository" "this" {
  name                 = var.name
  image_tag_mutability = "IMMUTABLE"

  image_scanning_configuration {
    scan_on_push = true
  }

  encryption_configuration {
    encryption_type = "KMS"
    kms_key         = var.kms_key_arn
  }
}

# Keeps the most recent keep_images images, and every deployed tag whatever its age: a running
# service's image expired by the count (an image per merge, a deployment a week) left the next task
# or GPU host launched unable to pull it, at a scale-out or a replacement. Each deployed tag has a
# rule of its own ahead of the count, keeping its one image (tags are immutable): ECR never expires
# an image that a higher-priority rule selects, and evaluates the rule over every tag last.
locals {
  protected_tags = distinct(var.protected_tags)
  lifecycle_rules = concat(
    [
      for i, tag in local.protected_tags : {
        rulePriority = i + 1
        description  = "Keep ${tag}: deployed"
        selection = {
          tagStatus      = "tagged"
          tagPatternList = [tag]
          countType      = "imageCountMoreThan"
          countNumber    = 1
        }
        action = { type = "expire" }
      }
    ],
    [{
      rulePriority = length(local.protected_tags) + 1
      description  = "Keep the most recent ${var.keep_images} images"
      selection = {
        tagStatus   = "any"
        countType   = "imageCountMoreThan"
        countNumber = var.keep_images
      }
      action = { type = "expire" }
    }],
  )
}

resource "aws_ecr_lifecycle_policy" "this" {
  repository = aws_ecr_repository.this.name
  policy     = jsonencode({ rules = local.lifecycle_rules })
}
