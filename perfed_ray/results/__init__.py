"""The results folder, owned here: :mod:`.layout` names its tables and folders,
:mod:`.schema` types the tables' columns, :mod:`.writer` writes a run's rows and
:mod:`.reader` reads them back, older versions' columns included. Analysis and
reports only consume it. Nothing is imported here: the actors write rows without
paying for pandas."""
