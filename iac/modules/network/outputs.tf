output "vpc_id" {
  description = "The VPC."
  value       = aws_vpc.this.id
}

output "vpc_cidr_block" {
  description = "The VPC's address range."
  value       = aws_vpc.this.cidr_block
}

output "public_subnet_ids" {
  description = "Subnets of the load balancer."
  value       = aws_subnet.public[*].id
}

output "private_subnet_ids" {
  description = "Subnets of the edge tasks, the GPU hosts and Redis."
  value       = aws_subnet.private[*].id
}
