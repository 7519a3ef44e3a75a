"""The inputs: what is served and on what. Model and GPU specs and their catalogs, the KV-cache format catalog,
config.json and the Hugging Face Hub, calibration and deployment profiles.
"""
