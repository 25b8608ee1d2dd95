"""lab: the live panels of JupyterLab (INTERACTIVE = True). Each panel's callbacks call the same study
functions as a batch run (widgets), laid out by panel and pagemap."""
