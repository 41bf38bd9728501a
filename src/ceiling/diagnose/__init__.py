"""Diagnosis: engine logs -> facts and findings, attribution, verdict, the doctor flow."""
