"""mamba_radix"""
