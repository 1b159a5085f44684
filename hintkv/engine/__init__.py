"""hintkv.engine"""
