"""hintkv.workload"""
